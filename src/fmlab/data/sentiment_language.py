"""A generated language in which a latent sentiment shapes the words (Chapter 4).

Each document has a latent sentiment :math:`s \\in \\{+1, -1\\}` (:math:`P(s=+1) = \\pi`). Its
sentence has :math:`L` words (:math:`L` uniform in ``[min_len, max_len]``) drawn
independently given :math:`s`: with probability :math:`\\rho` an *opinion word*, otherwise
a *neutral word* (uniform). Opinion words come in mirrored pairs (*good*/*bad*,
*superb*/*awful*, ...); pair :math:`j` has a weight :math:`u_j` and an ambiguity
:math:`\\eta_j \\in [\\eta_{min}, \\eta_{max}]` (irony, hedging): given :math:`s = +1`, the
positive word of pair :math:`j` has probability :math:`\\rho\\,u_j(1-\\eta_j)` and the negative
word :math:`\\rho\\,u_j\\eta_j` (and the mirror image for :math:`s=-1`). A word then shifts the
log-odds of the sentiment by :math:`\\pm\\log\\frac{1-\\eta_j}{\\eta_j}`. So

.. math::
    p(w_{1:L} \\mid s) = \\prod_{i} p(w_i \\mid s), \\qquad
    \\log\\frac{p(s=+1 \\mid w_{1:L})}{p(s=-1 \\mid w_{1:L})}
    = \\log\\frac{\\pi}{1-\\pi} + \\sum_i \\log\\frac{p(w_i \\mid +1)}{p(w_i \\mid -1)},

a naive-Bayes model whose posterior, and hence the Bayes-optimal accuracy, is exact.

The downstream task comes from a *review domain* that differs from the pretraining text in
one way: two words that are neutral in pretraining, *scary* and *predictable*, carry
sentiment there (a horror film should be scary; nobody likes a predictable plot). With
probability ``domain_rate`` an opinion word of the domain is one of them (ambiguity
``domain_ambiguity``). A pretrained model cannot know this; a few labelled examples can
teach it.

Pretraining text: ``[CLS] w_1 ... w_L`` and, with probability ``p_statement``, the
natural statement ``it was great .`` (if :math:`s=+1`) or ``it was terrible .``
(if :math:`s=-1`); the statement names the sentiment correctly with probability
``statement_fidelity``. A downstream sentiment task then has the natural prompt
``[CLS] w_1 ... w_L it was [MASK] .`` with label words *great* / *terrible*: filling in
the blank *is* a pretraining prediction (Definition 5.3 of Malladi et al., 2023).

Used in Chapter 4 (``notebooks/04-kernel-view.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["SentimentLanguageConfig", "SentimentLanguage"]

SPECIALS = ["[PAD]", "[MASK]", "[CLS]", ".", "it", "was", "great", "terrible"]
POSITIVE = [
    "good",
    "fun",
    "lovely",
    "brilliant",
    "charming",
    "superb",
    "moving",
    "witty",
    "fresh",
    "gripping",
]
NEGATIVE = [
    "bad",
    "dull",
    "boring",
    "awful",
    "clumsy",
    "tedious",
    "weak",
    "silly",
    "bland",
    "messy",
]
NEUTRAL = [
    "the",
    "a",
    "movie",
    "film",
    "plot",
    "actor",
    "story",
    "and",
    "scene",
    "music",
    "ending",
    "cast",
    "director",
    "script",
    "of",
    "with",
    "this",
    "very",
    "quite",
    "its",
    "scary",
    "predictable",
]
DOMAIN = ("scary", "predictable")  # positive, negative in the downstream review domain


@dataclass(frozen=True)
class SentimentLanguageConfig:
    """Parameters of :class:`SentimentLanguage` (``seed`` fixes the word weights)."""

    min_len: int = 4
    max_len: int = 10
    opinion_rate: float = 0.4  # rho
    irony_min: float = 0.05  # eta_j is uniform in [irony_min, irony_max]
    irony_max: float = 0.35
    prior_positive: float = 0.5  # pi, in pretraining text
    p_statement: float = 0.5
    statement_fidelity: float = 0.9
    domain_rate: float = 0.45
    domain_ambiguity: float = 0.1
    seed: int = 0

    def __post_init__(self):
        check_int("min_len", self.min_len, minimum=1)
        check_int("max_len", self.max_len, minimum=self.min_len)
        check_float("opinion_rate", self.opinion_rate, minimum=0.0, maximum=1.0)
        check_float(
            "irony_min", self.irony_min, minimum=0.0, maximum=0.5, strict_min=True
        )
        check_float("irony_max", self.irony_max, minimum=self.irony_min, maximum=0.5)
        check_float(
            "prior_positive",
            self.prior_positive,
            minimum=0.0,
            maximum=1.0,
            strict_min=True,
        )
        if self.prior_positive >= 1.0:
            raise ValueError(f"prior_positive must be < 1, got {self.prior_positive}")
        check_float("p_statement", self.p_statement, minimum=0.0, maximum=1.0)
        check_float(
            "statement_fidelity", self.statement_fidelity, minimum=0.0, maximum=1.0
        )
        check_float("domain_rate", self.domain_rate, minimum=0.0, maximum=1.0)
        check_float("domain_ambiguity", self.domain_ambiguity, minimum=0.0, maximum=0.5)
        check_int("seed", self.seed, minimum=0)


class SentimentLanguage:
    """The language: vocabulary, pretraining documents, prompted and plain task inputs."""

    def __init__(self, config: SentimentLanguageConfig = SentimentLanguageConfig()):
        if not isinstance(config, SentimentLanguageConfig):
            raise TypeError(
                f"config must be a SentimentLanguageConfig, got {type(config).__name__}"
            )
        self.config = c = config
        self.words = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL
        self.index = {w: i for i, w in enumerate(self.words)}
        self.pad_id, self.mask_id, self.cls_id = (
            self.index["[PAD]"],
            self.index["[MASK]"],
            self.index["[CLS]"],
        )
        self.period_id, self.it_id, self.was_id = (
            self.index["."],
            self.index["it"],
            self.index["was"],
        )
        self.great_id, self.terrible_id = self.index["great"], self.index["terrible"]
        self.label_ids = (self.great_id, self.terrible_id)  # label word for s=+1, s=-1
        pos = torch.tensor([self.index[w] for w in POSITIVE])
        neg = torch.tensor([self.index[w] for w in NEGATIVE])
        neu = torch.tensor([self.index[w] for w in NEUTRAL])
        g = make_generator(c.seed)
        weight = torch.rand(len(pos), generator=g, dtype=torch.float64) + 0.5
        weight = weight / weight.sum()  # u_j
        self.ambiguity = c.irony_min + (c.irony_max - c.irony_min) * torch.rand(
            len(pos), generator=g, dtype=torch.float64
        )
        V = len(self.words)
        # word distributions p(w | s) of the two domains; rows: s = +1, s = -1
        self.word_probs = {
            "pretrain": torch.zeros(2, V, dtype=torch.float64),
            "task": torch.zeros(2, V, dtype=torch.float64),
        }
        dom = torch.tensor([self.index[w] for w in DOMAIN])
        plain = torch.tensor([self.index[w] for w in NEUTRAL if w not in DOMAIN])
        for row, (own, other) in enumerate(((pos, neg), (neg, pos))):
            pre, task = self.word_probs["pretrain"], self.word_probs["task"]
            pre[row, own] += c.opinion_rate * weight * (1 - self.ambiguity)
            pre[row, other] += c.opinion_rate * weight * self.ambiguity
            pre[row, neu] += (1 - c.opinion_rate) / len(neu)
            lexicon = 1 - c.domain_rate
            task[row, own] += c.opinion_rate * lexicon * weight * (1 - self.ambiguity)
            task[row, other] += c.opinion_rate * lexicon * weight * self.ambiguity
            task[row, dom[row]] += (
                c.opinion_rate * c.domain_rate * (1 - c.domain_ambiguity)
            )
            task[row, dom[1 - row]] += (
                c.opinion_rate * c.domain_rate * c.domain_ambiguity
            )
            task[row, plain] += (1 - c.opinion_rate) / len(plain)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    @property
    def seq_len(self) -> int:
        """Longest document: ``[CLS]``, ``max_len`` words, ``it was <label> .``."""
        return self.config.max_len + 5

    # -- sampling --------------------------------------------------------------------
    def _check_generator(self, generator):
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )

    def _check_domain(self, domain: str) -> None:
        if domain not in ("pretrain", "task"):
            raise ValueError(
                f"domain must be one of ['pretrain', 'task'], got {domain!r}"
            )

    def sample_sentences(
        self,
        n: int,
        generator: torch.Generator,
        *,
        domain: str = "pretrain",
        prior_positive: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` sentences of ``domain``: sentiments ``(n,)`` in {+1, -1}, words
        ``(n, max_len)`` (``[PAD]`` after the end) and lengths ``(n,)``.

        ``prior_positive`` defaults to the config's :math:`\\pi` for pretraining text and
        to 1/2 for the (balanced) task domain.
        """
        n = check_int("n", n, minimum=1)
        self._check_generator(generator)
        self._check_domain(domain)
        c = self.config
        if prior_positive is None:
            pi = c.prior_positive if domain == "pretrain" else 0.5
        else:
            pi = check_float("prior_positive", prior_positive, minimum=0.0, maximum=1.0)
        s = torch.where(torch.rand(n, generator=generator) < pi, 1, -1)
        lengths = torch.randint(c.min_len, c.max_len + 1, (n,), generator=generator)
        probs = self.word_probs[domain][(s < 0).long()]  # (n, V)
        words = torch.multinomial(
            probs, c.max_len, replacement=True, generator=generator
        )
        words[torch.arange(c.max_len)[None, :] >= lengths[:, None]] = self.pad_id
        return s, words, lengths

    def _assemble(self, words, lengths, tail: torch.Tensor | None) -> torch.Tensor:
        """``[CLS] words tail`` for each row, right-padded to :attr:`seq_len`."""
        n = words.shape[0]
        out = torch.full((n, self.seq_len), self.pad_id, dtype=torch.long)
        out[:, 0] = self.cls_id
        out[:, 1 : 1 + words.shape[1]] = words
        if tail is not None:
            cols = 1 + lengths[:, None] + torch.arange(tail.shape[1])[None, :]
            out.scatter_(1, cols, tail)
        return out

    def sample_pretraining(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` pretraining documents as token ids ``(n, seq_len)``."""
        s, words, lengths = self.sample_sentences(n, generator)
        c = self.config
        true_word = torch.where(s > 0, self.great_id, self.terrible_id)
        flipped = torch.where(s > 0, self.terrible_id, self.great_id)
        faithful = torch.rand(n, generator=generator) < c.statement_fidelity
        label_word = torch.where(faithful, true_word, flipped)
        tail = torch.stack(
            [
                torch.full((n,), self.it_id),
                torch.full((n,), self.was_id),
                label_word,
                torch.full((n,), self.period_id),
            ],
            dim=1,
        )
        has = torch.rand(n, generator=generator) < c.p_statement
        tail[~has] = self.pad_id
        return self._assemble(words, lengths, tail)

    def task_inputs(
        self, words: torch.Tensor, lengths: torch.Tensor, *, prompt: str = "it was"
    ) -> torch.Tensor:
        """Token ids of downstream inputs built from sentences.

        ``prompt="it was"``: ``[CLS] w_1..w_L it was [MASK] .`` (the natural prompt);
        ``prompt="null"``: ``[CLS] w_1..w_L [MASK]`` (a "null prompt");
        ``prompt="none"``: ``[CLS] w_1..w_L`` (standard fine-tuning reads ``[CLS]``).
        """
        words = check_tensor("words", words, ndim=2, integer=True)
        lengths = check_tensor("lengths", lengths, ndim=1, integer=True)
        if prompt not in ("it was", "null", "none"):
            raise ValueError(
                f"prompt must be one of ['it was', 'null', 'none'], got {prompt!r}"
            )
        n = words.shape[0]
        if prompt == "none":
            return self._assemble(words, lengths, None)
        ids = (
            [self.it_id, self.was_id, self.mask_id, self.period_id]
            if prompt == "it was"
            else [self.mask_id]
        )
        tail = torch.tensor(ids).repeat(n, 1)
        return self._assemble(words, lengths, tail)

    # -- exact Bayesian quantities ---------------------------------------------------
    def log_odds(
        self, words: torch.Tensor, *, domain: str = "task", prior_positive: float = 0.5
    ) -> torch.Tensor:
        """Exact :math:`\\log p(s=+1 \\mid w)/p(s=-1 \\mid w)` under ``domain``'s word model
        and the prior ``prior_positive`` (float64, one per sentence)."""
        words = check_tensor("words", words, ndim=2, integer=True)
        self._check_domain(domain)
        pi = check_float(
            "prior_positive", prior_positive, minimum=0.0, maximum=1.0, strict_min=True
        )
        if pi >= 1.0:
            raise ValueError(f"prior_positive must be < 1, got {pi}")
        probs = self.word_probs[domain]
        llr = torch.cat(
            [probs[0].log() - probs[1].log(), torch.zeros(1, dtype=torch.float64)]
        )
        idx = torch.where(words == self.pad_id, len(self.words), words)
        return llr[idx].sum(1) + math.log(pi / (1 - pi))

    def bayes_accuracy(
        self,
        n: int = 200_000,
        seed: int = 777,
        *,
        domain: str = "task",
        model: str | None = None,
    ) -> float:
        """Accuracy on balanced sentences of ``domain`` of the Bayes classifier built from the
        word model of ``model`` (default: the same domain, i.e. the Bayes-optimal accuracy;
        ``model="pretrain"`` on ``domain="task"`` is the best a perfectly pretrained model
        can do zero-shot). Monte Carlo over ``n`` sentences; the posteriors are exact."""
        n = check_int("n", n, minimum=1)
        self._check_domain(domain)
        model = domain if model is None else model
        self._check_domain(model)
        s, words, _ = self.sample_sentences(
            n, make_generator(seed), domain=domain, prior_positive=0.5
        )
        pred = torch.where(self.log_odds(words, domain=model) > 0, 1, -1)
        return (pred == s).double().mean().item()

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """Readable strings of token rows (padding dropped)."""
        tokens = check_tensor("tokens", tokens, ndim=2, integer=True)
        return [
            " ".join(self.words[t] for t in row.tolist() if t != self.pad_id)
            for row in tokens
        ]

    def __repr__(self) -> str:
        c = self.config
        return (
            f"SentimentLanguage(V={self.vocab_size}, L in [{c.min_len}, {c.max_len}], rho={c.opinion_rate}, "
            f"eta in [{c.irony_min}, {c.irony_max}], pi={c.prior_positive}, p_statement={c.p_statement})"
        )
