"""Whether a Triton answer's kernel did the work, from evidence its wrapper cannot forge.

The wrapper is called once with the kernel's launches recorded (sandbox.helpers.launches). Then a fresh process that
ran none of the notebook's code, only its @triton.jit functions and the constants they read (kernel_cells), launches
the kernel again the same way: the same grid and scalars, the call's own inputs where the wrapper passed them, zeros
where it passed zeros, its own copy of an input the wrapper scaled, cast or transposed, NaN in every other buffer (one
the wrapper filled could hold an answer computed outside the kernel). Nothing the wrapper computed reaches the replay
but a few numbers (_scalars). What the wrapper returned must be what that replay wrote into one of its buffers. A
kernel that does nothing, or copies what the wrapper computed, writes NaN there or nothing at all.
"""

import ast
import itertools
import threading

import numpy as np

from autograder.check_submission import MAX_CELL_CHARS
from autograder.checking import StudentError, close, fail
from autograder.sandbox.wire import Array
from autograder.triton_fit import not_triton, not_triton_message, parsed, plain

# What the replay's process runs before the kernels: the imports a kernel uses, and the launcher.
PREAMBLE = '''
import math
import torch
import triton
import triton.language as tl


def _replay(name, buffers, launches):
    """Launch the kernel `name` as recorded; returns the buffers after."""
    kernel = globals()[name]
    for grid, args, kwargs in launches:
        pick = lambda v: buffers[v["buffer"]] if isinstance(v, dict) else v
        kernel[tuple(grid)](*[pick(v) for v in args], **{k: pick(v) for k, v in kwargs.items()})
    return buffers
'''
MAX_SCALARS = 32  # a kernel's launch takes a few sizes, strides and flags: not an answer spelled out in numbers
MAX_BUFFERS = 16  # and a few tensors: not one per number of an answer (each prepared one carries its scale, its axes)
MAX_FLOATS = 2  # a launch's floats: the scale (and perhaps one more constant)
MAX_INT = 4096  # an integer argument may exceed the largest input's or result's size only up to this (a block size)
MAX_WORDS = 64  # characters of string arguments in all of a call's launches
MAX_LAUNCHES, ELEMENTS_PER_LAUNCH = 4, 256  # distinct launches a call may make: a few, or one per 256 outputs
MAX_REPEATS = 4  # and launches in all, per distinct one allowed: a warm-up, or num_warps tuned on a shape's first call


_LAST = threading.local()  # the last cells _reading read and what it found there, per grading thread: nothing shared


def _reading(sources):
    """The reading of the cells the replay needs, made once for the same cells (every Triton check of one submission
    asks again): .parsed, triton_fit.parsed(sources, MAX_CELL_CHARS), where a cell longer, or that does not parse, gives
    nothing (a kernel there cannot be launched on its own); .foreign, {kernel: what not_triton finds in it}; .cells,
    their kernel_cells once asked for."""
    sources = tuple(sources)
    if getattr(_LAST, "sources", None) != sources:
        _LAST.sources, _LAST.parsed = sources, parsed(sources, MAX_CELL_CHARS)
        _LAST.cells, _LAST.foreign = None, {}
    return _LAST


def kernel_cells(cells):
    """The cells' imports of triton_fit.MODULES, the constants their @triton.jit functions read (names bound to
    literals or tl.constexpr of them), and those functions whose decorators, annotations and default values are plain
    (triton_fit.plain: they run as Python, before the launcher is called; the launched kernel and those it calls are
    refused by not_triton otherwise), a cell each after the PREAMBLE; cells: triton_fit.parsed(...)."""
    kernels, imports, constants = plain(cells)
    read = {n.id for k in kernels for n in ast.walk(k) if isinstance(n, ast.Name)}
    return (
        [PREAMBLE]
        + [ast.unparse(n) for n in imports]
        + [ast.unparse(n) for n, names in constants if names & read]
        + [ast.unparse(n) for n in kernels]
    )


def _prepared(buf, inputs):
    """A floating buffer that is one of the inputs scaled by one number, cast, and its axes permuted or reshaped (what a
    wrapper may prepare for a launch: q * scale, q.float(), k.transpose(-1, -2).contiguous()): (the grader's own copy of
    it, the scale), or None. The copy is that input permuted, times the scale, rounded to the buffer's dtype: nothing
    of the wrapper's reaches the replay but the scale, not the low bits of its values (which could spell an answer)."""
    data = np.asarray(buf.data)
    if not np.issubdtype(data.dtype, np.floating) or data.size == 0:
        return None
    eps = float(np.finfo(data.dtype).eps)  # the rounding of the wrapper's own product, in the buffer's dtype
    wide = data.astype(np.float64).ravel()
    finite = np.isfinite(wide)  # an input's -inf entries (softmax's masks) stay where they were, as they were
    if not finite.any():
        return None
    rtol, atol = 4 * eps, eps * float(np.abs(wide[finite]).max())  # atol: products rounded to subnormals
    for a in inputs:
        x = np.asarray(a.data)
        if x.size != wide.size or x.ndim > 5 or not np.issubdtype(x.dtype, np.floating):
            continue
        for axes in itertools.permutations(range(x.ndim)):
            flat = x.transpose(axes).astype(np.float64).ravel()
            if not np.array_equal(np.isfinite(flat), finite):
                continue
            i = int(np.argmax(np.where(finite, np.abs(flat), 0)))
            scale = float(wide[i] / flat[i]) if flat[i] != 0 else 0.0
            scale = 1.0 if abs(scale - 1) <= rtol else scale  # a cast, rounded: no scale
            if (
                scale != 0
                and np.allclose(wide[finite], flat[finite] * scale, rtol=rtol, atol=atol)
                and np.array_equal(wide[~finite], flat[~finite] * scale, equal_nan=True)
            ):
                return (flat * scale).astype(data.dtype).reshape(data.shape), scale
    return None


def _replay_buffers(buffers, inputs, judged=None):
    """({key: array}, [scale]): the call's own input where a buffer holds exactly one, fresh zeros where it is all
    zeros (not the wrapper's: their signs could spell an answer), the grader's copy where it is an input prepared for
    the launch (_prepared; its scale, unless 1, listed as a float the launch passed), NaN (or, an integer buffer, -1)
    everywhere else but in the buffer `judged` (the key of the one a planned call returned, whose replay the check
    judges), fresh zeros: what the kernel leaves unwritten there reads as in a torch.zeros the wrapper made, not as the
    NaN of an overflow."""
    out, scales = {}, []
    for key, buf in buffers.items():
        if not isinstance(buf, Array):
            fail("the kernel was launched with an argument that is not a tensor or a number")
        data = np.asarray(buf.data)
        same = next(
            (
                a
                for a in inputs
                if a.shape == buf.shape and a.dtype == buf.dtype and np.array_equal(a.data, buf.data, equal_nan=True)
            ),
            None,
        )
        prepared = None if same is not None or not np.any(data) else _prepared(buf, inputs)
        if same is not None:
            out[key] = same
        elif not np.any(data):
            out[key] = Array(buf.kind, buf.dtype, np.zeros_like(data), device=buf.device)
        elif prepared is not None:
            copy, scale = prepared
            out[key] = Array(buf.kind, buf.dtype, copy, device=buf.device)
            scales += [scale] if scale != 1 else []
        else:
            fill = np.nan if np.issubdtype(data.dtype, np.floating) or buf.dtype == "bfloat16" else -1
            fill = 0 if key == judged else fill
            out[key] = Array(buf.kind, buf.dtype, np.full(buf.shape, fill, dtype=data.dtype), device=buf.device)
    return out, scales


def _scalars(launches, inputs, got, scales):
    """Refuse launches whose non-tensor arguments could carry an answer. A launch takes a few tensors, sizes, strides,
    block sizes and flags, and a float or two (the scale, passed or multiplied into an input: scales, from
    _replay_buffers): so at most MAX_BUFFERS tensors and MAX_SCALARS numbers per launch, MAX_FLOATS floats, integers
    no larger than twice the largest input or result (sizes, strides and offsets are; a float's bits are not; not a
    buffer's, which the wrapper sizes: a large one would let the integers carry more bits), short words, and no more
    distinct launches than the output's size allows (many launches of a few numbers each could spell it out)."""
    values = [[v for v in [*args, *kwargs.values()] if not isinstance(v, dict)] for _, args, kwargs in launches]
    flat = [v for launch in values for v in launch]
    plain = all(v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 16) for v in flat)
    if any(sum(isinstance(v, dict) for v in [*args, *kwargs.values()]) > MAX_BUFFERS for _, args, kwargs in launches):
        fail(
            f"the kernel was launched with more than {MAX_BUFFERS} tensors: pass it the inputs and the output, and "
            "let it compute the result from them"
        )
    if not plain or any(len(launch) > MAX_SCALARS for launch in values):
        fail(
            "the kernel was launched with more than a few sizes, strides and flags besides its tensors: pass the "
            "kernel tensors, and let it compute the result from them"
        )
    largest = max([int(np.prod(a.shape)) for a in [*inputs, got] if isinstance(a, Array)] + [1])
    floats = [v for v in flat if isinstance(v, float)] + scales
    ints = [v for v in flat if isinstance(v, int) and not isinstance(v, bool)]
    words = sum(len(v) for v in flat if isinstance(v, str))
    if (
        len(floats) > MAX_FLOATS * len(launches)
        or any(abs(v) > max(MAX_INT, 2 * largest) for v in ints)
        or words > MAX_WORDS
    ):
        fail(
            "the kernel was launched with numbers that are not sizes, strides, flags or a scale (more than "
            f"{MAX_FLOATS} floats a launch, counting an input you scaled before the launch, or integers larger than "
            "any size): data must reach the kernel in tensors"
        )
    size = int(np.prod(got.shape)) if isinstance(got, Array) else 0
    allowed = max(MAX_LAUNCHES, size // ELEMENTS_PER_LAUNCH)
    # A launch repeated with the same arguments carries nothing new to the replay (the recorded call is the wrapper's
    # first on that shape, where a wrapper may warm up or time a few launches): counted once, up to MAX_REPEATS times
    if len({repr(launch) for launch in launches}) > allowed or len(launches) > MAX_REPEATS * allowed:
        fail(
            f"the kernel was launched {len(launches)} times for {size} outputs: launch it once, with a grid of "
            "programs, rather than passing it the work a few numbers at a time"
        )


def recorded(s, wrapper, kernel, inputs, kwargs):
    """(wrapper(*inputs, **kwargs), the launches of `kernel`, a @triton.jit function the notebook defines, during that
    call as sandbox.helpers.launches records them: (buffers, [(grid, args, kwargs)]), or None where the notebook
    defines no such kernel)."""
    try:
        run = s.get(kernel, "run")
    except StudentError:
        return s.call(wrapper, *inputs, **kwargs), None
    reply = s.helper("launches", run, s.get(wrapper, "__call__"), *inputs, **kwargs)
    if not (isinstance(reply, (list, tuple)) and len(reply) == 3 and _well_formed(*reply[1:])):
        fail(FORGED)
    got, buffers, launches = reply
    return got, (buffers, launches)


# What a reply that sandbox.helpers' recorder cannot have made says (code in the student's process changed it)
FORGED = (
    "the record of your kernel's launches that your notebook's process sent is not one the grader's recorder makes: "
    "does your code change the grader's server?"
)


def _well_formed(buffers, launches):
    """Whether (buffers, launches) has the form sandbox.helpers.launches gives them: {key: buffer}, and [(grid of
    integers, [argument], {name: argument})], every tensor argument {"buffer": a key of buffers}."""
    tensor = lambda v: not isinstance(v, dict) or (list(v) == ["buffer"] and v["buffer"] in buffers)  # noqa: E731
    return (
        isinstance(buffers, dict)
        and isinstance(launches, list)
        and all(
            isinstance(launch, (list, tuple))
            and len(launch) == 3
            and isinstance(launch[0], list)
            and all(isinstance(g, int) for g in launch[0])
            and isinstance(launch[1], list)
            and isinstance(launch[2], dict)
            and all(tensor(v) for v in [*launch[1], *launch[2].values()])
            for launch in launches
        )
    )


def planned(s, wrapper, kernel, inputs, kwargs):
    """((the key of the buffer wrapper(*inputs, **kwargs) returned, its shape), the launches of `kernel` during that
    call as sandbox.helpers.planned_launches records them, not run: (buffers, launches)), where the wrapper returned a
    buffer it launched the kernel on: the replay gives what the call returns, and the kernel runs once, there. None
    where it returned anything else or raised (a wrapper that reads its kernel's output before returning it), or the
    notebook defines no such kernel: recorded() calls it then, the kernel run."""
    try:
        run = s.get(kernel, "run")
        plan = s.helper("planned_launches", run, s.get(wrapper, "__call__"), *inputs, **kwargs)
    except StudentError:
        return None
    if plan is None:
        return None
    if not (isinstance(plan, (list, tuple)) and len(plan) == 3 and _well_formed(*plan[1:])):
        fail(FORGED)
    returned, buffers, launches = plan
    key, shape = returned if isinstance(returned, (list, tuple)) and len(returned) == 2 else (None, None)
    buffer = buffers.get(key) if isinstance(key, str) else None
    if not (
        isinstance(buffer, Array)
        and isinstance(shape, list)
        and all(isinstance(n, int) and n >= 0 for n in shape)
        and int(np.prod(shape)) == np.asarray(buffer.data).size
    ):
        fail(FORGED)
    return (key, shape), (buffers, launches)


def expect_kernel_did_the_work(s, wrapper, kernel, inputs, what, got, launched, judge=None):
    """What wrapper returned on inputs (Arrays), got, is what `kernel` wrote, launched again by the grader in a fresh
    process as the wrapper launched it (launched: recorded()'s record; see the module's docstring). judge: where the
    launches were planned (planned()), got is (the key of the buffer the wrapper returned, its shape), and judge gives
    the call's verdict on what the replay wrote there. A part of a check (Check.steps) that pauses before the
    replay."""
    if launched is None:
        fail(
            f"{wrapper} must launch a @triton.jit kernel named {kernel}, which does the work; the notebook defines "
            f"no such kernel"
        )
    buffers, launches = launched
    if not launches:
        fail(f"{wrapper} never launched {kernel}: the work must happen in your @triton.jit kernel")
    replayed, scales = _replay_buffers(buffers, inputs, got[0] if judge else None)
    _scalars(launches, inputs, buffers[got[0]] if judge else got, scales)
    reading = _reading(s.readable_sources())  # once: the grader's own work grows with the cells' length
    if kernel not in reading.foreign:
        reading.foreign[kernel] = not_triton(reading.parsed, [kernel])
    for name, foreign in reading.foreign[kernel]:
        fail(not_triton_message(name, foreign))
    replay_cells = reading.cells = reading.cells or kernel_cells(reading.parsed)
    yield s.next_process(cells=replay_cells)  # one process replays the kernels of every Triton check (Check.steps)
    with s.elsewhere(replay_cells):
        try:
            after = s.call("_replay", kernel, replayed, launches)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - a StudentError: the kernel could not run on its own
            if judge:  # a planned call's kernel ran only here: its own mistake, as likely as a name it misses here
                fail(
                    f"{what}: {kernel} raised {e} when the grader launched it as {wrapper} did, in a fresh process "
                    "with only your @triton.jit functions, the imports of math, torch and triton, and constants you "
                    "assign at the top level of a cell"
                )
            fail(
                f"{kernel} could not be launched on its own ({e}): the grader runs it again in a fresh process with "
                "only your @triton.jit functions, the imports of math, torch and triton, and constants you assign "
                "at the top level of a cell"
            )
    if judge:
        key, shape = got
        wrote = after[key]
        judge(Array(wrote.kind, wrote.dtype, np.asarray(wrote.data).reshape(shape), device=wrote.device))
        return
    if not isinstance(got, Array) or not any(
        isinstance(b, Array)
        and b.shape == got.shape
        and close(got, Array(b.kind, got.dtype, b.data.astype(np.asarray(got.data).dtype), device=got.device))
        for b in after.values()
    ):
        fail(
            f"{what}: what {wrapper} returned is not what {kernel} wrote when the grader launched it again the same "
            f"way, from the inputs alone: the work must happen in your @triton.jit kernel, into the buffer you "
            f"return (compute nothing in torch around the launch)"
        )
