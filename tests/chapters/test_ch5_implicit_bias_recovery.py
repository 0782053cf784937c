"""Tests of what the six-seed same-loss run of Chapter 5 adds (notebooks/05b): the run
without continued SGD from the pretrained models, and the recovery arms from the
adversarial models (its probes scored against the exact posterior are tested with the
probes, in tests/lib/test_ridge_probes.py).

Oracles: the first members of an ensemble are copied exactly; every recovery arm
starts from the same adversarial models (its first row is shared).
"""

from dataclasses import replace

import pytest
import torch
from test_ch5_implicit_bias import TINY

from fmlab.chapters import ch5_implicit_bias as ch5
from fmlab.models.masked_lm import BiGRUMaskedLM
from fmlab.repro import make_generator

# the tiny config of test_ch5_implicit_bias, with three seeds, no continued SGD from
# the pretrained models and two recovery arms of two checkpoints
SMALL = replace(
    TINY,
    n_models=3,
    sgd_models=2,
    continue_steps=0,
    recovery_steps=4,
    recovery_checkpoints=2,
    recovery_batches=(8, 16),
    recovery_lrs=(0.1, 0.2),
)


def test_first_members_are_copied_exactly():
    m = BiGRUMaskedLM(5, hidden=4, d_ff=6, n_models=3, generator=make_generator(1))
    sub = ch5._first_members(m, 2)
    assert sub.n_models == 2
    for p, q in zip(m.parameters(), sub.parameters()):
        assert torch.equal(p[:2], q)
    tok = torch.randint(0, 5, (7, 10), generator=make_generator(2))
    assert torch.allclose(m(tok)[:2], sub(tok))


def test_the_run_without_continued_sgd_and_its_recovery_arms():
    res = ch5.same_loss_experiment(SMALL)
    E, k = SMALL.n_models, SMALL.recovery_checkpoints + 1
    assert not any(key.startswith("continue_") for key in res)
    assert res["pretrained_gap"].shape == (E,)
    assert res["pretrained_accuracy"].shape == (E, 2)
    assert res["bartlett_fisher"].shape == (SMALL.sgd_models,)
    assert torch.equal(res["recovery_steps"], torch.tensor([0, 2, 4]))
    for i in range(2):
        assert res[f"recovery{i}_gap"].shape == (k, E)
        assert res[f"recovery{i}_accuracy"].shape == (k, E, 2)
        assert res[f"recovery{i}_trace_encoder"].shape == (E,)
        acc = res[f"recovery{i}_accuracy"]
        assert ((acc >= 0) & (acc <= 1)).all()
    for key in ("gap", "accuracy"):  # both arms start from the same models
        assert torch.equal(res[f"recovery0_{key}"][0], res[f"recovery1_{key}"][0])
    assert not torch.equal(res["recovery0_gap"][-1], res["recovery1_gap"][-1])


def test_recovery_arms_must_pair_learning_rates_and_batches():
    with pytest.raises(ValueError, match="recovery_lrs"):
        replace(SMALL, recovery_batches=(8,))
    with pytest.raises(ValueError, match="recovery_steps"):
        replace(SMALL, recovery_steps=5)
