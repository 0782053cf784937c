"""fmlab.chapters.ch5_room: the exact ceilings of a world, against brute force."""

import itertools

import pytest
import torch

from fmlab.chapters.ch5_room import RoomConfig, probe_ceilings
from fmlab.data.hmm_language import HMMLanguage, HMMLanguageConfig

TINY = HMMLanguageConfig(n_blocks=2, states_per_block=2, length=4, seed=3)


def _enumerated_bayes(lang: HMMLanguage, position: int) -> float:
    """E_x max_k P(block of h_t = k | x), summing over every hidden and token path."""
    c = lang.config
    H, V, T, S = c.n_states, c.vocab_size, c.length, c.states_per_block
    pi, A, E = lang.initial, lang.transition, lang.emission
    joint = {}  # (tokens, block at position) -> probability
    for hs in itertools.product(range(H), repeat=T):
        ph = pi[hs[0]] * torch.prod(torch.stack([A[a, b] for a, b in zip(hs, hs[1:])]))
        for xs in itertools.product(range(V), repeat=T):
            p = ph * torch.prod(torch.stack([E[h, x] for h, x in zip(hs, xs)]))
            key = (xs, hs[position] // S)
            joint[key] = joint.get(key, 0.0) + float(p)
    total = 0.0
    for xs in itertools.product(range(V), repeat=T):
        total += max(joint.get((xs, k), 0.0) for k in range(c.n_blocks))
    return total


def test_bayes_accuracy_matches_enumeration_and_bounds_every_probe():
    cfg = RoomConfig(language=TINY, position=1, probe_sizes=(200, 2000), n_test=4000)
    out = probe_ceilings(cfg)
    exact = _enumerated_bayes(HMMLanguage(TINY), 1)
    # the estimate is a mean of 4000 values in [1/2, 1]: s.e. below 0.004
    assert out["bayes"] == pytest.approx(exact, abs=0.012)
    for name in ("posterior", "lookup", "tokens"):
        assert len(out[name]) == 2
        # an expected accuracy under the exact posterior never beats its maximum
        assert all(a <= out["bayes"] + 1e-12 for a in out[name])


def test_the_posterior_probe_reaches_bayes_and_the_tied_lookup_does_not():
    # tied emissions: the look-up table sees the block only through token order
    lang = HMMLanguageConfig(n_blocks=2, states_per_block=3, length=6, seed=1)
    out = probe_ceilings(RoomConfig(language=lang, position=3, probe_sizes=(4000,)))
    assert out["bayes"] - out["posterior"][0] < 0.01
    assert out["posterior"][0] - out["lookup"][0] > 0.1


def test_state_task_and_arguments():
    out = probe_ceilings(
        RoomConfig(
            language=TINY, position=0, task="state", probe_sizes=(100,), n_test=200
        )
    )
    assert 0.25 <= out["bayes"] <= 1.0
    with pytest.raises(ValueError):
        RoomConfig(language=TINY, task="other")
    with pytest.raises(ValueError):
        RoomConfig(language=TINY, position=4)
    with pytest.raises(TypeError):
        probe_ceilings("not a config")


def test_the_page_table_and_prose_read_the_ceilings():
    from fmlab.chapters import ch5_figures as fig5

    rooms = {"tiny": RoomConfig(TINY, position=2, probe_sizes=(50, 100), n_test=100)}
    ceilings = {"tiny": probe_ceilings(rooms["tiny"])}
    fig5.ceilings_table(ceilings, rooms)
    texts = fig5.prose_ceilings(ceilings, rooms)
    out = ceilings["tiny"]
    assert texts["ch5_rm_bayes_0"] == f"{out['bayes']:.3f}"
    assert texts["ch5_rm_n_0"] == "100"
    room = 100 * (out["posterior"][1] - out["lookup"][1])
    assert texts["ch5_rm_room_0"] == f"{room:.0f}"
