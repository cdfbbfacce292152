"""A process's peak resident memory, read while it runs: the grading runs of tests/ bound the grader's own memory."""

import threading
import time
from pathlib import Path


def communicate(proc, timeout):
    """proc.communicate(timeout=timeout) while its VmHWM (peak resident memory) is read every 50 ms: returns
    (stdout, stderr, the peak in MiB). VmHWM is the kernel's own high-water mark, so a sample taken late still
    holds the peak; 0 if the process ended before the first read."""
    peak = [0]

    def watch():
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak[0] = max(peak[0], int(status.split("VmHWM:")[1].split()[0]) // 1024)
            except (OSError, IndexError):
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate(timeout=timeout)
    watcher.join()
    return out, err, peak[0]
