"""Lesson 07's training script and committed checkpoints: induction heads really form.

Thresholds are set against what a head with no preference scores. A head that spreads its attention uniformly over
the keys it may see gives query i the weight 1/(i+1) per key, so on the test sequences (a random half repeated once)
it scores, averaged over the scored queries:
    previous-token:  mean over i = 1..T-1 of 1/(i+1)     about 0.10 for T = 32, 0.16 for T = 16
    induction:       mean over i = p..T-1 of 1/(i+1)     about 0.04 for T = 32 (p = 16), 0.08 for T = 16 (p = 8)
Every threshold below is at least five times that, and well under what the model reaches (in brackets, measured).
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from solutions.head_specialization import (
    half_losses,
    head_scores,
    load_checkpoint,
    repeated_sequences,
    train,
    training_batch,
)

# What tests/lessons/test_<module>.py collects from here.
__all__ = [
    "small_run",
    "test_reduced_training_forms_an_induction_head",
    "test_training_is_deterministic",
    "test_train_leaves_the_thread_setting_alone",
    "test_committed_checkpoint_has_the_lessons_heads",
    "test_training_batch_is_reproducible",
    "test_the_script_writes_a_checkpoint",
]

LESSON = Path(__file__).resolve().parents[2] / "lessons" / "07_head_specialization"


def uniform_score(score, T, period):
    """What a uniform causal head scores: the baseline every threshold is compared with."""
    p = torch.ones(T, T, dtype=torch.float64).tril()
    p = (p / p.sum(-1, keepdim=True))[None]
    return score(p) if period is None else score(p, period)


@pytest.fixture(scope="module")
def small_run():
    """The training script at a reduced size: sequences of 16, 2 heads of width 16, 600 steps (3 s on one core)."""
    return train(steps=600, vocab_size=32, half=8, d_model=32, n_heads=2, log_every=100)


def test_reduced_training_forms_an_induction_head(small_run):
    from solutions.head_specialization import induction_score, previous_token_score

    model, history = small_run
    chance_induction = uniform_score(induction_score, 16, 8).item()  # 0.08
    chance_previous = uniform_score(previous_token_score, 16, None).item()  # 0.16
    final = history[-1]
    # an induction head in layer 1 puts most of its attention on the token after the earlier copy (0.80)
    assert max(final["induction"][1]) > max(0.5, 5 * chance_induction)
    # ...and it rests on a previous-token head in layer 0 (0.55): three times chance
    assert max(final["previous"][0]) > 3 * chance_previous
    # it pays off: the repeated half is predicted far better than the random first half (0.5 against 3.5 nats)
    assert final["loss_repeat"] < final["loss_first"] - 2
    # and it formed during training: at step 0 no head was anywhere near
    assert max(history[0]["induction"][1]) < 2 * chance_induction


def test_training_is_deterministic():
    a, _ = train(steps=30, vocab_size=16, half=6, d_model=16, n_heads=2, log_every=30)
    b, _ = train(steps=30, vocab_size=16, half=6, d_model=16, n_heads=2, log_every=30)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k


def test_train_leaves_the_thread_setting_alone():
    threads = torch.get_num_threads()
    train(steps=1, vocab_size=16, half=4, d_model=16, n_heads=2, log_every=1)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("name, n_kv_heads", [("induction_model.npz", None), ("induction_model_gqa.npz", 2)])
def test_committed_checkpoint_has_the_lessons_heads(name, n_kv_heads):
    path = LESSON / name
    assert path.stat().st_size < 300_000, "the checkpoint should stay small (a few hundred KB at most)"
    model, history = load_checkpoint(path)
    assert model.config["n_kv_heads"] == n_kv_heads and model.config["n_layers"] == 2
    probe = repeated_sequences(32, 16, 64, torch.Generator().manual_seed(123))
    scores = head_scores(model, probe)
    first, repeat = half_losses(model, probe)
    # layer 1 has an induction head (0.89 / 0.92 measured; uniform: 0.04)
    assert scores["induction"][1].max() > 0.7
    # layer 0 has a previous-token head (0.80 / 0.69; uniform: 0.10)
    assert scores["previous"][0].max() > 0.5
    # ... and a duplicate-token head (0.82 / 0.84; a head on itself scores 0)
    assert scores["duplicate"][0].max() > 0.5
    # no induction head in layer 0: it cannot form there (0.09 / 0.08)
    assert scores["induction"][0].max() < 0.3
    # the first half stays unpredictable (about ln 64 = 4.16) and the repeated half is nearly solved (0.27 / 0.33)
    assert first > np.log(64) - 0.1 and repeat < 0.6
    # the stored history shows the phase change: a plateau near ln 64, then the drop
    assert history[0]["step"] == 0 and history[-1]["step"] == 2000
    assert min(r["loss_repeat"] for r in history if r["step"] <= 300) > 3.5
    assert history[-1]["loss_repeat"] < 0.6 and max(history[-1]["induction"][1]) > 0.7


def test_training_batch_is_reproducible():
    a = training_batch(8, 32, 64, 4, 16, torch.Generator().manual_seed(5))
    b = training_batch(8, 32, 64, 4, 16, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_the_script_writes_a_checkpoint(tmp_path):
    """`python -m solutions.head_specialization OUT.npz` end to end, shortened with --steps."""
    import subprocess
    import sys

    out = tmp_path / "tiny.npz"
    p = subprocess.run(
        [sys.executable, "-m", "solutions.head_specialization", str(out), "--steps", "25", "--kv-heads", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert p.returncode == 0, p.stderr[-2000:]
    model, history = load_checkpoint(out)
    assert model.config["n_kv_heads"] == 2 and [r["step"] for r in history] == [0, 25]
