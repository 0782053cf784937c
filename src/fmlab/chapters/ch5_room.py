"""How much room a language leaves for a better representation (Chapter 5, page 05c).

Before any model is trained, the language itself fixes three ceilings for a linear
probe of the label :math:`y` (the block, or the state, of the hidden state
:math:`h_t` at one position) trained on :math:`n` labelled sentences:

* the **Bayes accuracy** :math:`\\mathbb{E}_x \\max_k P(y = k \\mid x)`, the most any
  representation can give;
* the probe on the **exact posterior** of every hidden state, :math:`(P(h_s = \\cdot
  \\mid x))_{s \\le T}`: the block posterior at :math:`t` is a linear function of it, so
  this probe reaches the Bayes accuracy as :math:`n` grows, and it is what a model that
  represents the hidden states perfectly would give;
* the probe on the **look-up table** of Liu et al. (2023), the concatenated exact
  masked conditionals :math:`(p^\\star(\\cdot \\mid x_{-s}))_{s \\le T}`, the
  representation of a model that is perfect at pretraining and nothing more; and the
  probe on the raw one-hot tokens.

A model at the optimal pretraining loss can sit anywhere between the look-up table and
the exact posterior; the paper's size effect needs that interval to be wide and the
models not already at its top. Every probe is the ridge classifier of
:func:`fmlab.adapt.probes.ridge_probe_curve`, scored by its expected accuracy under the
exact posterior of the test sentences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F

from .._validate import check_choice, check_int
from ..adapt.probes import ridge_probe_curve
from ..data.hmm_language import HMMLanguage, HMMLanguageConfig
from ..repro import make_generator
from ..train import cached

__all__ = ["RoomConfig", "probe_ceilings"]


@dataclass(frozen=True)
class RoomConfig:
    """One world and task of :func:`probe_ceilings`."""

    language: HMMLanguageConfig = field(default_factory=HMMLanguageConfig)
    position: int = 5  # the task reads the hidden state at this position
    task: str = "block"  # or "state"
    probe_sizes: tuple = (3000, 20_000)
    n_test: int = 5000
    ridge: float = 1e-2

    def __post_init__(self):
        if not isinstance(self.language, HMMLanguageConfig):
            raise TypeError("language must be an HMMLanguageConfig")
        check_int(
            "position", self.position, minimum=0, maximum=self.language.length - 1
        )
        check_choice("task", self.task, ("block", "state"))
        for n in self.probe_sizes:
            check_int("probe_sizes", n, minimum=2)
        check_int("n_test", self.n_test, minimum=1)


def probe_ceilings(config: RoomConfig) -> dict:
    """The Bayes accuracy (``"bayes"``) and the expected accuracy of the ridge probe on
    the exact posterior, the look-up table and the raw tokens (``"posterior"``,
    ``"lookup"``, ``"tokens"``: one value per probe size), for training sentences from
    ``make_generator(10_003)`` and test sentences from ``make_generator(10_004)``.
    Kept in the model cache (:func:`fmlab.train.cached`): the two worlds of page 05c
    took 3 s of each of its runs."""
    if not isinstance(config, RoomConfig):
        raise TypeError(f"config must be a RoomConfig, got {type(config).__name__}")
    return cached(config, lambda: _probe_ceilings(config), name="ch5_probe_ceilings")


def _probe_ceilings(c: RoomConfig) -> dict:
    lang = HMMLanguage(c.language)
    S, V, t = c.language.states_per_block, c.language.vocab_size, c.position
    tr_tok, tr_h = lang.sample(max(c.probe_sizes), make_generator(10_003))
    te_tok, te_h = lang.sample(c.n_test, make_generator(10_004))
    if c.task == "block":
        ytr, yte, n_classes = tr_h[:, t] // S, te_h[:, t] // S, c.language.n_blocks
        post = lang.block_posterior(te_tok)[:, t]
    else:
        ytr, yte, n_classes = tr_h[:, t], te_h[:, t], c.language.n_states
        post = lang.state_posterior(te_tok)[:, t]
    representations = {
        "posterior": lang.state_posterior,
        "lookup": lang.masked_conditionals,
        "tokens": lambda tok: F.one_hot(tok, V).double(),
    }
    out = {"bayes": float(post.max(-1).values.mean())}
    for name, phi in representations.items():
        out[name] = ridge_probe_curve(
            phi(tr_tok).flatten(1),
            ytr,
            phi(te_tok).flatten(1),
            yte,
            n_classes,
            c.probe_sizes,
            c.ridge,
            post,
        ).tolist()
    return out
