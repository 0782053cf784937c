"""A generated language in which sentiment and negation shape the words (Chapter 4).

Each document has a latent sentiment :math:`s \\in \\{+1, -1\\}`, with :math:`P(s=+1) =
\\pi`. Its sentence is a sequence of *units*, drawn independently given :math:`s`. A
unit is a word, preceded with probability :math:`\\nu` (the *negation rate*) by the word
*not*. With probability :math:`1-\\rho` the word is neutral (uniform over the neutral
words); with probability :math:`\\rho` it is an *opinion*: a mirrored pair :math:`j`
(*good*/*bad*, *superb*/*awful*, ...) is drawn with weight :math:`u_j`, the opinion
means :math:`m = s` with probability :math:`1-\\eta_j` and :math:`m = -s` with
probability :math:`\\eta_j` (irony, hedging; :math:`\\eta_j \\in [\\eta_{min},
\\eta_{max}]`), and the word of the pair that says :math:`m` is written, or, if the unit
is negated, the word that says :math:`-m` after *not* (*not bad* for a positive
opinion). So *not* flips the meaning of the word it precedes, and a unit shifts the
log-odds of the sentiment by

.. math::
    \\lambda(\\text{unit}) = (-1)^{\\text{negated}}\\;\\operatorname{pol}(w)\\,
    \\log\\frac{1-\\eta_j}{\\eta_j} \\qquad (0 \\text{ for a neutral word}),

with :math:`\\operatorname{pol}(w) = \\pm 1` the polarity of the opinion word :math:`w`.
A sentence has :math:`U` units, :math:`U` uniform in ``[min_units, max_units]`` and
independent of everything else (so between :math:`U` and :math:`2U` tokens), and the
posterior is exact:

.. math::
    \\log\\frac{p(s=+1 \\mid \\text{sentence})}{p(s=-1 \\mid \\text{sentence})} =
    \\log\\frac{\\pi}{1-\\pi} + \\sum_{\\text{units}} \\lambda(\\text{unit}).

**Word order matters.** In a domain with :math:`\\nu = 1/2`, every word has the same
expected count under :math:`s=+1` as under :math:`s=-1` (a positive opinion is *good*
or *not bad* with equal probability): the first-order statistics of a *bag of words*
carry no information, and the sentiment is carried by which word follows *not*. (Word
counts are not useless altogether: *not* co-occurring with one opinion word is a
second-order cue that a classifier of counts can pick up from enough examples.)

The downstream task comes from a *review domain* that negates more than pretraining text
(``task_negation_rate``, 1/2 by default, so that word counts carry no first-order
information).
Optionally (``domain_rate`` > 0, default 0) it also reverses one opinion pair: in
pretraining text *predictable* is praise and *scary* a complaint; in the (horror)
reviews of the task, with probability ``domain_rate`` an opinion uses the pair with the
opposite meaning (*scary* is praise), with ambiguity ``domain_ambiguity``. A pretrained
model cannot know that; labelled examples can teach it.

Pretraining text: ``[CLS] sentence`` and, with probability ``p_statement``, the natural
statement ``it was great .`` (if :math:`s=+1`) or ``it was terrible .`` (if
:math:`s=-1`), naming the sentiment correctly with probability ``statement_fidelity``. A
downstream sentiment task then has the natural prompt ``[CLS] sentence it was [MASK] .``
with label words *great* / *terrible*: filling in the blank *is* a pretraining
prediction (Definition 5.3 of Malladi et al., 2023).

Used in Chapter 4 (``notebooks/04-kernel-view.ipynb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["SentimentLanguageConfig", "SentimentLanguage"]

SPECIALS = ["[PAD]", "[MASK]", "[CLS]", ".", "it", "was", "great", "terrible", "not"]
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
]
#: An opinion pair whose meaning the downstream domain reverses: in pretraining text
#: "predictable" is praise and "scary" a complaint; in the (horror) reviews of the task
#: "scary" is praise and "predictable" a complaint.
DOMAIN = ("scary", "predictable")  # positive, negative in the downstream review domain


@dataclass(frozen=True)
class SentimentLanguageConfig:
    """Parameters of :class:`SentimentLanguage` (``seed`` fixes the word weights)."""

    min_units: int = 3  # units of a sentence (a word, or "not" and a word)
    max_units: int = 6
    opinion_rate: float = 0.6  # rho
    irony_min: float = 0.05  # eta_j is uniform in [irony_min, irony_max]
    irony_max: float = 0.25
    prior_positive: float = 0.5  # pi, in pretraining text
    negation_rate: float = 0.3  # nu, in pretraining text
    task_negation_rate: float = 0.5  # nu in the downstream domain
    p_statement: float = 0.9
    statement_fidelity: float = 0.9
    domain_rate: float = 0.0
    domain_ambiguity: float = 0.1
    seed: int = 0

    def __post_init__(self):
        check_int("min_units", self.min_units, minimum=1)
        check_int("max_units", self.max_units, minimum=self.min_units)
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
        check_float("negation_rate", self.negation_rate, minimum=0.0, maximum=1.0)
        check_float(
            "task_negation_rate", self.task_negation_rate, minimum=0.0, maximum=1.0
        )
        check_float("p_statement", self.p_statement, minimum=0.0, maximum=1.0)
        check_float(
            "statement_fidelity", self.statement_fidelity, minimum=0.0, maximum=1.0
        )
        check_float("domain_rate", self.domain_rate, minimum=0.0, maximum=1.0)
        check_float(
            "domain_ambiguity",
            self.domain_ambiguity,
            minimum=0.0,
            maximum=0.5,
            strict_min=True,
        )
        check_int("seed", self.seed, minimum=0)


class SentimentLanguage:
    """The language: vocabulary, pretraining documents, prompted and plain task
    inputs."""

    def __init__(self, config: SentimentLanguageConfig = SentimentLanguageConfig()):
        if not isinstance(config, SentimentLanguageConfig):
            raise TypeError(
                f"config must be a SentimentLanguageConfig, got {type(config).__name__}"
            )
        self.config = c = config
        self.words = SPECIALS + POSITIVE + NEGATIVE + list(DOMAIN) + NEUTRAL
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
        self.not_id = self.index["not"]
        self.great_id, self.terrible_id = self.index["great"], self.index["terrible"]
        self.label_ids = (self.great_id, self.terrible_id)  # label word for s=+1, s=-1
        self.domain_ids = torch.tensor([self.index[w] for w in DOMAIN])
        # pairs j = 0..9 of the lexicon, and pair 10: (predictable, scary)
        self.positive_ids = torch.tensor(
            [self.index[w] for w in POSITIVE] + [self.index[DOMAIN[1]]]
        )
        self.negative_ids = torch.tensor(
            [self.index[w] for w in NEGATIVE] + [self.index[DOMAIN[0]]]
        )
        self.neutral_ids = torch.tensor([self.index[w] for w in NEUTRAL])
        g = make_generator(c.seed)
        n_pairs = len(POSITIVE) + 1
        weight = torch.rand(n_pairs, generator=g, dtype=torch.float64) + 0.5
        self.pair_weight = weight / weight.sum()  # u_j, in pretraining text
        lexicon = self.pair_weight.clone()
        lexicon[-1] = 0.0  # the task draws the domain pair separately
        self.task_pair_weight = lexicon / lexicon.sum()
        self.ambiguity = c.irony_min + (c.irony_max - c.irony_min) * torch.rand(
            n_pairs, generator=g, dtype=torch.float64
        )
        # lambda of an un-negated occurrence of each word, per domain
        V = len(self.words)
        shift = torch.log((1 - self.ambiguity) / self.ambiguity)
        self.word_llr = {}
        for domain in ("pretrain", "task"):
            llr = torch.zeros(V, dtype=torch.float64)
            llr[self.positive_ids] = shift
            llr[self.negative_ids] = -shift
            if domain == "task":
                d = math.log((1 - c.domain_ambiguity) / c.domain_ambiguity)
                llr[self.domain_ids[0]], llr[self.domain_ids[1]] = d, -d
            self.word_llr[domain] = llr

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    @property
    def seq_len(self) -> int:
        """Longest document: ``[CLS]``, the longest sentence, ``it was <label> .``."""
        return self.max_tokens + 5

    @property
    def max_tokens(self) -> int:
        """Longest sentence in tokens: ``2 max_units`` (every unit negated)."""
        return 2 * self.config.max_units

    def negation_rate(self, domain: str) -> float:
        """:math:`\\nu` of ``domain``."""
        self._check_domain(domain)
        c = self.config
        return c.negation_rate if domain == "pretrain" else c.task_negation_rate

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
        """``n`` sentences of ``domain``: sentiments ``(n,)`` in {+1, -1}, tokens ``(n,
        max_tokens)`` (``[PAD]`` after the end) and lengths ``(n,)`` in tokens.

        ``prior_positive`` defaults to the config's :math:`\\pi` for pretraining text
        and to 1/2 for the (balanced) task domain.
        """
        n = check_int("n", n, minimum=1)
        self._check_generator(generator)
        self._check_domain(domain)
        c = self.config
        if prior_positive is None:
            pi = c.prior_positive if domain == "pretrain" else 0.5
        else:
            pi = check_float("prior_positive", prior_positive, minimum=0.0, maximum=1.0)
        U = c.max_units
        s = torch.where(torch.rand(n, generator=generator) < pi, 1, -1)
        n_units = torch.randint(c.min_units, c.max_units + 1, (n,), generator=generator)
        negated = torch.rand(n, U, generator=generator) < self.negation_rate(domain)
        opinion = torch.rand(n, U, generator=generator) < c.opinion_rate
        neutral = self.neutral_ids
        word = neutral[torch.randint(len(neutral), (n, U), generator=generator)]
        # an opinion: pair j and whether it means s (1 - eta_j) or -s (eta_j)
        weights = self.pair_weight if domain == "pretrain" else self.task_pair_weight
        pair = torch.multinomial(
            weights.expand(n, -1), U, replacement=True, generator=generator
        )
        eta = self.ambiguity[pair]
        u = torch.rand(n, U, generator=generator, dtype=torch.float64)
        if domain == "task":
            dom = torch.rand(n, U, generator=generator) < c.domain_rate
            eta = torch.where(dom, torch.full_like(eta, c.domain_ambiguity), eta)
        meaning = torch.where(u < eta, -s[:, None], s[:, None])
        says = torch.where(negated, -meaning, meaning)  # the polarity of the word
        op_word = torch.where(
            says > 0, self.positive_ids[pair], self.negative_ids[pair]
        )
        if domain == "task":
            dom_word = torch.where(says > 0, self.domain_ids[0], self.domain_ids[1])
            op_word = torch.where(dom, dom_word, op_word)
        word = torch.where(opinion, op_word, word)
        # the first n_units units (a rule that does not depend on s or on the flags)
        keep = torch.arange(U)[None, :] < n_units[:, None]
        # tokens: (not?) word for each kept unit, then compacted to the left
        pairs = torch.stack([torch.full_like(word, self.not_id), word], dim=2)
        valid = torch.stack([negated & keep, keep], dim=2).reshape(n, 2 * U)
        pairs = pairs.reshape(n, 2 * U)
        order = torch.argsort((~valid).long(), dim=1, stable=True)
        tokens = torch.gather(pairs, 1, order)
        count = valid.sum(1)
        tokens[torch.arange(2 * U)[None, :] >= count[:, None]] = self.pad_id
        return s, tokens, count

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
    def unit_llr(self, words: torch.Tensor, *, domain: str = "task") -> torch.Tensor:
        """:math:`\\lambda` at every token of ``words`` ``(n, T)`` under ``domain``'s
        model: the word's log-likelihood ratio, sign-flipped after *not*; 0 on *not*,
        neutral words and padding (float64, ``(n, T)``)."""
        words = check_tensor("words", words, ndim=2, integer=True)
        self._check_domain(domain)
        llr = self.word_llr[domain][words]
        after_not = torch.zeros_like(words, dtype=torch.bool)
        after_not[:, 1:] = words[:, :-1] == self.not_id
        return torch.where(after_not, -llr, llr)

    def log_odds(
        self, words: torch.Tensor, *, domain: str = "task", prior_positive: float = 0.5
    ) -> torch.Tensor:
        """Exact :math:`\\log p(s=+1 \\mid w)/p(s=-1 \\mid w)` under ``domain``'s word
        model and the prior ``prior_positive`` (float64, one per sentence)."""
        pi = check_float(
            "prior_positive", prior_positive, minimum=0.0, maximum=1.0, strict_min=True
        )
        if pi >= 1.0:
            raise ValueError(f"prior_positive must be < 1, got {pi}")
        return self.unit_llr(words, domain=domain).sum(1) + math.log(pi / (1 - pi))

    def word_frequencies(self, domain: str = "task") -> torch.Tensor:
        """Exact expected count of each token per unit, given :math:`s`: ``(2, V)``
        float64, rows :math:`s=+1` and :math:`s=-1` (the first-order statistics a bag of
        words sees; *not* included)."""
        self._check_domain(domain)
        c = self.config
        nu = self.negation_rate(domain)
        out = torch.zeros(2, self.vocab_size, dtype=torch.float64)
        if domain == "pretrain":
            pairs = [
                (self.pair_weight, self.ambiguity, self.positive_ids, self.negative_ids)
            ]
        else:
            eta_d = torch.tensor([c.domain_ambiguity], dtype=torch.float64)
            pairs = [
                (
                    (1 - c.domain_rate) * self.task_pair_weight,
                    self.ambiguity,
                    self.positive_ids,
                    self.negative_ids,
                ),
                (
                    torch.tensor([c.domain_rate], dtype=torch.float64),
                    eta_d,
                    self.domain_ids[:1],
                    self.domain_ids[1:],
                ),
            ]
        for row, s in enumerate((1, -1)):
            out[row, self.neutral_ids] += (1 - c.opinion_rate) / len(self.neutral_ids)
            out[row, self.not_id] += nu
            for weight, eta, pos, neg in pairs:
                for ids, pol in ((pos, 1), (neg, -1)):
                    # the word says pol: the opinion means pol and is not negated, or
                    # means -pol and is negated
                    p_m = 1 - eta if pol == s else eta
                    out[row, ids] += (
                        c.opinion_rate * weight * (p_m * (1 - nu) + (1 - p_m) * nu)
                    )
        return out

    def bayes_accuracy(
        self,
        n: int = 200_000,
        seed: int = 777,
        *,
        domain: str = "task",
        model: str | None = None,
    ) -> float:
        """Accuracy on balanced sentences of ``domain`` of the Bayes classifier built
        from the word model of ``model`` (default: the same domain, i.e. the
        Bayes-optimal accuracy; ``model="pretrain"`` on ``domain="task"`` is the best a
        perfectly pretrained model can do zero-shot). Monte Carlo over ``n`` sentences;
        the posteriors are exact."""
        n = check_int("n", n, minimum=1)
        self._check_domain(domain)
        model = domain if model is None else model
        self._check_domain(model)
        s, words, _ = self.sample_sentences(
            n, make_generator(seed), domain=domain, prior_positive=0.5
        )
        pred = torch.where(self.log_odds(words, domain=model) > 0, 1, -1)
        return (pred == s).double().mean().item()

    def bag_of_words(self, words: torch.Tensor) -> torch.Tensor:
        """Word counts ``(n, V)`` (float32) of sentences ``words`` ``(n, T)``, padding
        and the special tokens other than *not* excluded."""
        words = check_tensor("words", words, ndim=2, integer=True)
        counts = torch.zeros(words.shape[0], self.vocab_size)
        counts.scatter_add_(1, words, torch.ones(words.shape, dtype=counts.dtype))
        counts[:, : self.not_id] = 0.0
        return counts

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
            f"SentimentLanguage(V={self.vocab_size}, "
            f"U in [{c.min_units}, {c.max_units}], "
            f"rho={c.opinion_rate}, eta in [{c.irony_min}, {c.irony_max}], "
            f"nu={c.negation_rate} (task {c.task_negation_rate}), "
            f"pi={c.prior_positive}, p_statement={c.p_statement})"
        )
