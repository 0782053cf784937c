"""GINC: the generative in-context learning data set of Xie et al. (ICLR 2022).

A *world* is a mixture of hidden Markov models. The hidden state is a pair
:math:`h = (e, s)` of an **entity** :math:`e \\in \\{0, \\dots, E-1\\}` and a
**property** :math:`s \\in \\{0, \\dots, P-1\\}`, stored as the index
:math:`h = eP + s`. The two chains move independently:

.. math::
    p(h_{t+1} = (e', s') \\mid h_t = (e, s), c) = A_{e e'}\\, B^{(c)}_{s s'},
    \\qquad T_c = A \\otimes B^{(c)} .

* :math:`A` (entities) is fixed for the world and *sticky*:
  :math:`A = \\beta I + (1 - \\beta)\\,\\Pi_A` with :math:`\\beta` =
  ``entity_stickiness``;
* :math:`B^{(c)}` (properties) is the **concept** :math:`c`. Every transition matrix
  :math:`\\Pi` here is a mixture of random permutation matrices,
  :math:`\\Pi = \\sum_{j} w_j P_{\\sigma_j}` with peaked weights
  :math:`w = \\operatorname{softmax}((u - 1/2)/\\tau)`, :math:`u_j \\sim U[0,1]`,
  :math:`\\tau` = ``transition_temp``, as in the paper's generator;
* the token is read from a **memory matrix**
  :math:`M \\in \\{0,\\dots,V-1\\}^{E\\times P}`: :math:`o_t = M[e_t, s_t]`
  (deterministic emission). Column 0 is the delimiter token 0, so property 0 emits
  the delimiter ``/`` whatever the entity; the other entries are uniform over
  :math:`\\{1,\\dots,V-1\\}`.
* the first hidden state has law ``start_probs[c]`` (a softmax of uniform noise at
  temperature ``start_temp``, nearly uniform).

Of the ``n_concepts`` concepts the first half is **seen** (pretraining documents each
come from one of them, uniformly) and the second half is **unseen** (held out for
prompts).

A **prompt** for concept :math:`c^\\star` with :math:`n` examples of length :math:`k`: a
start property :math:`s_0 \\in \\{1,\\dots,P-1\\}` shared by the prompt; each of the
:math:`n+1` examples starts at a fresh uniform entity and property :math:`s_0` and runs
:math:`k-1` transitions of :math:`T_{c^\\star}`; examples are joined by the delimiter.
The last (test) example loses its last token; the **label** is the most likely next
token under :math:`c^\\star` given the test input alone (started at a uniform entity
and property :math:`s_0`), not the sampled token.

**Documents with state jumps** (:func:`smoothed_documents`): at every position, with
probability :math:`\\varepsilon` the hidden state jumps to a state drawn uniformly from
all :math:`H` states instead of following :math:`T_c`, so the chain moves by the
smoothed matrix that the smoothed Bayes predictor assumes,

.. math::
    T_c^{(\\varepsilon)} = (1 - \\varepsilon)\\, T_c
    + \\varepsilon\\, \\mathbf{1}\\mathbf{1}^\\top / H ,

and a prompt's boundary (a change of state under an unchanged concept) becomes a
possible event of pretraining. :math:`\\varepsilon = 0` is the paper's GINC.

Sampling is vectorized over documents (or prompts and examples): the only Python loop
runs over positions. Used in Chapter 6 (``notebooks/06-in-context-learning.ipynb`` and
``notebooks/06b-icl-transformer.ipynb``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_choice, check_float, check_int, check_tensor
from ..repro import make_generator
from ..theory.bayes_icl import (
    BayesPrediction,
    _check_hmm,
    _posterior_predictive_from_alpha,
    forward_log_alpha_deterministic,
    log_likelihood_given_state,
    next_token_distribution,
    smooth_transitions,
)

__all__ = [
    "ginc_bayes_predictor",
    "distinguishability",
    "GINCConfig",
    "GINC_PRESETS",
    "ginc_preset",
    "GINC",
    "Documents",
    "smoothed_documents",
    "Prompts",
    "permutation_mixture",
    "assemble_prompts",
    "prompt_length",
    "DELIMITER",
    "token_names",
]

#: The delimiter token (emitted by property 0, whatever the entity).
DELIMITER = 0


@dataclass(frozen=True)
class GINCConfig:
    """Parameters of a GINC world and of its pretraining corpus.

    ``seed`` fixes the world (memory matrix, transition matrices); ``corpus_seed`` the
    pretraining documents. The defaults are the paper's full configuration (see
    :data:`GINC_PRESETS`).
    """

    n_entities: int = 10
    n_properties: int = 10
    vocab_size: int = 50
    n_concepts: int = (
        10  # the first half is seen in pretraining, the second half unseen
    )
    transition_temp: float = 0.1
    start_temp: float = 10.0
    entity_stickiness: float = 0.9
    n_documents: int = 1000
    document_length: int = 10240
    seed: int = 1111
    corpus_seed: int = 1112

    def __post_init__(self):
        check_int("n_entities", self.n_entities, minimum=1)
        check_int("n_properties", self.n_properties, minimum=2)
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("n_concepts", self.n_concepts, minimum=2)
        check_float(
            "transition_temp", self.transition_temp, minimum=0.0, strict_min=True
        )
        check_float("start_temp", self.start_temp, minimum=0.0, strict_min=True)
        check_float(
            "entity_stickiness", self.entity_stickiness, minimum=0.0, maximum=1.0
        )
        check_int("n_documents", self.n_documents, minimum=1)
        check_int("document_length", self.document_length, minimum=2)
        check_int("seed", self.seed, minimum=0)
        check_int("corpus_seed", self.corpus_seed, minimum=0)

    @property
    def n_states(self) -> int:
        """Number of hidden states :math:`H = EP`."""
        return self.n_entities * self.n_properties

    @property
    def n_seen(self) -> int:
        """Number of concepts used for pretraining (the first half)."""
        return self.n_concepts // 2


#: Named configurations. ``"paper"`` is the configuration of Xie et al. (2022): 10
#: entities, 10 properties, vocabulary 50, 5 + 5 concepts, 1000 documents of 10 240
#: tokens.
#: ``"cpu"`` keeps the world of the same size but has a tenth of the pretraining tokens
#: (Chapter 6 pretrains a small transformer on it in under two minutes of CPU).
#: ``"tiny"`` is for unit tests.
GINC_PRESETS: dict[str, GINCConfig] = {
    "paper": GINCConfig(),
    "cpu": GINCConfig(n_documents=200, document_length=5120),
    "tiny": GINCConfig(
        n_entities=2,
        n_properties=3,
        vocab_size=5,
        n_concepts=4,
        n_documents=8,
        document_length=64,
    ),
}


def ginc_preset(name: str, **overrides) -> GINCConfig:
    """The named preset of :data:`GINC_PRESETS`, with any field replaced by
    ``overrides``."""
    check_choice("name", name, tuple(GINC_PRESETS))
    from dataclasses import replace

    return replace(GINC_PRESETS[name], **overrides)


def permutation_mixture(
    size: int, n_permutations: int, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """A random stochastic matrix :math:`\\sum_j w_j P_{\\sigma_j}`, shape ``(size,
    size)``.

    The :math:`\\sigma_j` are uniform random permutations and
    :math:`w = \\operatorname{softmax}((u - 1/2)/\\text{temperature})` with :math:`u_j
    \\sim U[0,1]`, so a small temperature makes one permutation dominate.
    """
    size = check_int("size", size, minimum=1)
    n_permutations = check_int("n_permutations", n_permutations, minimum=1)
    temperature = check_float("temperature", temperature, minimum=0.0, strict_min=True)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator, got {type(generator).__name__}"
        )
    u = torch.rand(n_permutations, generator=generator, dtype=torch.float64)
    w = torch.softmax((u - 0.5) / temperature, dim=0)
    perms = torch.argsort(torch.rand(n_permutations, size, generator=generator), dim=1)
    eye = torch.eye(size, dtype=torch.float64)
    return torch.einsum("j,jab->ab", w, eye[perms])  # eye[perm] has row a = e_{perm[a]}


def _categorical(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: row-wise ``cdf`` ``(N, K)``, uniforms ``u`` ``(N,)`` ->
    ``(N,)``."""
    idx = torch.searchsorted(cdf, u.unsqueeze(1).to(cdf.dtype), right=True).squeeze(1)
    return idx.clamp_(max=cdf.shape[1] - 1)


@dataclass(frozen=True)
class Documents:
    """Sampled documents: ``tokens`` and hidden ``states`` ``(N, L)``, ``concepts``
    ``(N,)``."""

    tokens: torch.Tensor
    states: torch.Tensor
    concepts: torch.Tensor


@dataclass(frozen=True)
class Prompts:
    """A batch of in-context prompts (all with the same ``n`` and ``k``).

    Attributes
    ----------
    examples : (B, n + 1, k) int64
        Tokens of every example; the last is the test example with its sampled last
        token.
    tokens : (B, n (k + 1) + k - 1) int64
        The prompt the model reads: examples joined by the delimiter, test token
        removed.
    labels : (B,) int64
        The most likely next token under the prompt concept given the test input.
    concepts : (B,) int64
        The prompt concept :math:`c^\\star` of each prompt.
    start_property : (B,) int64
        The shared start property :math:`s_0` of each prompt (for prompts of random
        slot patterns, :meth:`GINC.sample_pattern_prompts`, the first slot of the
        test example).
    uniform_start : bool
        True when the label was computed with the first hidden state uniform over all
        states (random slot patterns) instead of uniform over the entities at
        ``start_property``.
    """

    examples: torch.Tensor
    tokens: torch.Tensor
    labels: torch.Tensor
    concepts: torch.Tensor
    start_property: torch.Tensor
    uniform_start: bool = False

    @property
    def n_examples(self) -> int:
        return self.examples.shape[1] - 1

    @property
    def example_length(self) -> int:
        return self.examples.shape[2]

    def with_examples(self, n: int) -> "Prompts":
        """The same prompts keeping only the first ``n`` in-context examples (and the
        test example).

        Prompts with different ``n`` then share their test inputs and labels, so
        accuracies at different ``n`` are compared on the same questions (a paired
        design).
        """
        n = check_int("n", n, minimum=0, maximum=self.n_examples)
        ex = torch.cat([self.examples[:, :n], self.examples[:, -1:]], dim=1)
        return Prompts(
            ex,
            assemble_prompts(ex),
            self.labels,
            self.concepts,
            self.start_property,
            self.uniform_start,
        )

    def reordered(self, order: torch.Tensor) -> "Prompts":
        """The same prompts with the ``n`` in-context examples put in ``order`` (a
        permutation)."""
        order = check_tensor("order", order, shape=(self.n_examples,), integer=True)
        if not torch.equal(torch.sort(order).values, torch.arange(self.n_examples)):
            raise ValueError(
                f"order must be a permutation of 0..{self.n_examples - 1}, got "
                f"{order.tolist()}"
            )
        idx = torch.cat([order, torch.tensor([self.n_examples])])
        ex = self.examples[:, idx]
        return Prompts(
            ex,
            assemble_prompts(ex),
            self.labels,
            self.concepts,
            self.start_property,
            self.uniform_start,
        )


def token_names(vocab_size: int) -> list[str]:
    """Readable names for tokens, as in the paper's data: ``/`` for the delimiter, then
    ``a``..``z``, then two-letter names ``ab``, ``ac``, ..."""
    vocab_size = check_int("vocab_size", vocab_size, minimum=1)
    import itertools
    import string

    letters = list(string.ascii_lowercase)
    names = ["/"] + letters + ["".join(p) for p in itertools.permutations(letters, 2)]
    if vocab_size > len(names):
        raise ValueError(f"vocab_size must be at most {len(names)}, got {vocab_size}")
    return names[:vocab_size]


def prompt_length(n_examples: int, example_length: int) -> int:
    """Number of tokens of a prompt with ``n_examples`` examples of ``example_length``
    tokens: :math:`n (k + 1) + k - 1` (each example and its delimiter, then the test
    input of :math:`k - 1` tokens)."""
    n = check_int("n_examples", n_examples, minimum=0)
    k = check_int("example_length", example_length, minimum=2)
    return n * (k + 1) + k - 1


def assemble_prompts(examples: torch.Tensor) -> torch.Tensor:
    """Join examples ``(B, n + 1, k)`` with the delimiter and drop the test example's
    last token."""
    examples = check_tensor("examples", examples, ndim=3, integer=True)
    B, m, k = examples.shape
    delim = torch.full((B, m, 1), DELIMITER, dtype=examples.dtype)
    flat = torch.cat([examples, delim], dim=2).reshape(B, m * (k + 1))
    return flat[
        :, : m * (k + 1) - 2
    ]  # drop the final delimiter and the test example's last token


class GINC:
    """A GINC world: the mixture of HMMs of the module docstring."""

    def __init__(self, config: GINCConfig = GINCConfig()):
        if not isinstance(config, GINCConfig):
            raise TypeError(f"config must be a GINCConfig, got {type(config).__name__}")
        self.config = c = config
        g = make_generator(c.seed)
        E, P, V = c.n_entities, c.n_properties, c.vocab_size
        memory = torch.randint(1, V, (E, P), generator=g)
        memory[:, 0] = DELIMITER
        self.memory = memory
        mix = permutation_mixture(E, E, c.transition_temp, g)
        self.entity_transition = (
            c.entity_stickiness * torch.eye(E, dtype=torch.float64)
            + (1 - c.entity_stickiness) * mix
        )
        self.property_transitions = torch.stack(
            [
                permutation_mixture(P, P, c.transition_temp, g)
                for _ in range(c.n_concepts)
            ]
        )
        u = torch.rand(c.n_concepts, c.n_states, generator=g, dtype=torch.float64)
        self.start_probs = torch.softmax((u - 0.5) / c.start_temp, dim=1)

    # -- structure ------------------------------------------------------------------
    @property
    def n_states(self) -> int:
        return self.config.n_states

    @property
    def seen_concepts(self) -> torch.Tensor:
        """Indices of the concepts of the pretraining distribution."""
        return torch.arange(self.config.n_seen)

    @property
    def unseen_concepts(self) -> torch.Tensor:
        """Indices of the held-out concepts."""
        return torch.arange(self.config.n_seen, self.config.n_concepts)

    @property
    def state_tokens(self) -> torch.Tensor:
        """The token emitted by each hidden state :math:`h = eP + s`: shape ``(H,)``."""
        return self.memory.reshape(-1)

    def emission_matrix(self) -> torch.Tensor:
        """The one-hot emission matrix :math:`O_{hv} = [M_h = v]`, shape ``(H, V)``,
        float64."""
        emit = torch.zeros(self.n_states, self.config.vocab_size, dtype=torch.float64)
        emit[torch.arange(self.n_states), self.state_tokens] = 1.0
        return emit

    def transition_matrices(self, concepts=None) -> torch.Tensor:
        """:math:`T_c = A \\otimes B^{(c)}` for the given concepts, shape
        ``(C, H, H)``."""
        concepts = self.concept_indices(concepts)
        return torch.stack(
            [
                torch.kron(self.entity_transition, self.property_transitions[i])
                for i in concepts.tolist()
            ]
        )

    def concept_indices(self, concepts) -> torch.Tensor:
        """Concept indices from ``"seen"``, ``"unseen"``, ``"all"`` or a 1-D integer
        tensor."""
        if concepts is None or (isinstance(concepts, str) and concepts == "seen"):
            return self.seen_concepts
        if isinstance(concepts, str):
            check_choice("concepts", concepts, ("seen", "unseen", "all"))
            return (
                self.unseen_concepts
                if concepts == "unseen"
                else torch.arange(self.config.n_concepts)
            )
        concepts = check_tensor("concepts", concepts, ndim=1, integer=True)
        if (
            concepts.numel() == 0
            or concepts.min() < 0
            or concepts.max() >= self.config.n_concepts
        ):
            raise ValueError(
                f"concepts must hold indices in [0, {self.config.n_concepts - 1}], "
                f"got {concepts.tolist()}"
            )
        return concepts

    # -- sampling -------------------------------------------------------------------
    def _run_chains(self, entity, prop, concept, steps, generator):
        """Advance entity/property chains ``steps`` times; return states
        ``(N, steps + 1)``."""
        P = self.config.n_properties
        cdf_a = self.entity_transition.cumsum(1)
        cdf_b = self.property_transitions.cumsum(2)
        u = torch.rand(
            steps, 2, entity.shape[0], generator=generator, dtype=torch.float64
        )
        states = [entity * P + prop]
        for t in range(steps):  # one iteration per position, vectorized over sequences
            entity = _categorical(cdf_a[entity], u[t, 0])
            prop = _categorical(cdf_b[concept, prop], u[t, 1])
            states.append(entity * P + prop)
        return torch.stack(states, dim=1)

    def sample_documents(
        self, n: int, length: int, generator: torch.Generator, concepts="seen"
    ) -> Documents:
        """``n`` documents of ``length`` tokens, each from one concept drawn uniformly
        from ``concepts``."""
        n = check_int("n", n, minimum=1)
        length = check_int("length", length, minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        pool = self.concept_indices(concepts)
        concept = pool[torch.randint(len(pool), (n,), generator=generator)]
        u0 = torch.rand(n, generator=generator, dtype=torch.float64)
        h0 = _categorical(self.start_probs[concept].cumsum(1), u0)
        P = self.config.n_properties
        states = self._run_chains(h0 // P, h0 % P, concept, length - 1, generator)
        return Documents(self.state_tokens[states], states, concept)

    def pretraining_corpus(self) -> torch.Tensor:
        """The pretraining token stream: ``n_documents`` documents from the seen
        concepts, each followed by a delimiter, concatenated (``corpus_seed`` fixes
        it)."""
        c = self.config
        docs = self.sample_documents(
            c.n_documents, c.document_length, make_generator(c.corpus_seed)
        )
        delim = torch.full((c.n_documents, 1), DELIMITER, dtype=docs.tokens.dtype)
        return torch.cat([docs.tokens, delim], dim=1).reshape(-1)

    def sample_prompts(
        self,
        n_prompts: int,
        n_examples: int,
        example_length: int,
        generator: torch.Generator,
        concepts="seen",
        start_property: int | None = None,
    ) -> Prompts:
        """``n_prompts`` prompts with ``n_examples`` examples of ``example_length``
        tokens.

        ``concepts`` is ``"seen"``, ``"unseen"`` or a tensor of concept indices; each
        prompt draws its concept uniformly from them. ``start_property`` fixes
        :math:`s_0` (drawn uniformly from 1..P-1 per prompt if None). See the module
        docstring for the format.
        """
        B = check_int("n_prompts", n_prompts, minimum=1)
        n = check_int("n_examples", n_examples, minimum=0)
        k = check_int("example_length", example_length, minimum=2)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        c = self.config
        pool = self.concept_indices(concepts)
        concept = pool[torch.randint(len(pool), (B,), generator=generator)]
        if start_property is None:
            start = torch.randint(1, c.n_properties, (B,), generator=generator)
        else:
            start = torch.full(
                (B,),
                check_int(
                    "start_property",
                    start_property,
                    minimum=1,
                    maximum=c.n_properties - 1,
                ),
            )
        entity = torch.randint(c.n_entities, (B, n + 1), generator=generator)
        states = self._run_chains(
            entity.reshape(-1),
            start.repeat_interleave(n + 1),
            concept.repeat_interleave(n + 1),
            k - 1,
            generator,
        )
        examples = self.state_tokens[states].reshape(B, n + 1, k)
        labels = self.most_likely_next_token(examples[:, -1, :-1], concept, start)
        return Prompts(examples, assemble_prompts(examples), labels, concept, start)

    def sample_pattern_prompts(
        self,
        n_prompts: int,
        n_examples: int,
        example_length: int,
        generator: torch.Generator,
        concepts="unseen",
    ) -> Prompts:
        """Prompts of **random slot patterns**, labelled by a concept: Xie et al.'s
        prompts for unseen concepts.

        Each of the ``n_examples + 1`` examples reads one entity, uniform and fixed
        along the example, at ``example_length`` properties drawn independently and
        uniformly from :math:`\\{1,\\dots,P-1\\}` (no HMM moves them, so the examples
        carry no information about any concept); examples are joined by the
        delimiter as in :meth:`sample_prompts`. Each prompt draws its concept
        uniformly from ``concepts`` (by default the held-out ones), and its label is
        that concept's most likely next token after the test input, with the first
        hidden state uniform over all states. A test input impossible under its
        concept is drawn again (the authors' code labels it with the delimiter, an
        artifact of the NaN posterior), so every label is the concept's prediction.
        """
        B = check_int("n_prompts", n_prompts, minimum=1)
        n = check_int("n_examples", n_examples, minimum=0)
        k = check_int("example_length", example_length, minimum=2)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        c = self.config
        pool = self.concept_indices(concepts)
        concept = pool[torch.randint(len(pool), (B,), generator=generator)]
        slots = torch.randint(1, c.n_properties, (B, n + 1, k), generator=generator)
        entity = torch.randint(c.n_entities, (B, n + 1, 1), generator=generator)
        examples = self.memory[entity.expand(B, n + 1, k), slots]
        for _ in range(1000):  # redraw test inputs impossible under their concept
            probs = self.next_token_probs(
                examples[:, -1, :-1], concept, slots[:, -1, 0], uniform_start=True
            )
            bad = probs.isnan().any(1).nonzero().squeeze(1)
            if len(bad) == 0:
                break
            slots[bad, -1] = torch.randint(
                1, c.n_properties, (len(bad), k), generator=generator
            )
            entity[bad, -1] = torch.randint(
                c.n_entities, (len(bad), 1), generator=generator
            )
            examples[bad, -1] = self.memory[
                entity[bad, -1].expand(len(bad), k), slots[bad, -1]
            ]
        start, labels = slots[:, -1, 0].clone(), probs.argmax(1)
        return Prompts(
            examples, assemble_prompts(examples), labels, concept, start, True
        )

    def most_likely_next_token(
        self,
        inputs: torch.Tensor,
        concepts: torch.Tensor,
        start_property: torch.Tensor,
        uniform_start: bool = False,
    ) -> torch.Tensor:
        """:math:`\\arg\\max_v p(o_{k} = v \\mid o_{1:k-1}, c)` for test inputs ``(B,
        k-1)``: the argmax of :meth:`next_token_probs` (the delimiter where the input
        is impossible under its concept)."""
        probs = self.next_token_probs(inputs, concepts, start_property, uniform_start)
        return probs.nan_to_num(-1.0).argmax(1)

    def next_token_probs(
        self,
        inputs: torch.Tensor,
        concepts: torch.Tensor,
        start_property: torch.Tensor,
        uniform_start: bool = False,
    ) -> torch.Tensor:
        """:math:`p(o_{k} = v \\mid o_{1:k-1}, c)` for test inputs ``(B, k-1)``, shape
        ``(B, V)``.

        The first hidden state is uniform over entities at property ``start_property``
        (or, with ``uniform_start``, over all states); computed exactly with the
        forward algorithm of :mod:`fmlab.theory.bayes_icl`. Rows whose input is
        impossible under their concept are NaN.
        """
        inputs = check_tensor("inputs", inputs, ndim=2, integer=True)
        B = inputs.shape[0]
        concepts = check_tensor("concepts", concepts, shape=(B,), integer=True)
        start_property = check_tensor(
            "start_property", start_property, shape=(B,), integer=True
        )
        E, P = self.config.n_entities, self.config.n_properties
        init = torch.zeros(B, 1, self.n_states, dtype=torch.float64)
        idx = torch.arange(E).unsqueeze(0) * P + start_property.unsqueeze(1)  # (B, E)
        init.scatter_(2, idx.unsqueeze(1), 1.0 / E)
        if uniform_start:  # the first hidden state uniform over all states
            init.fill_(1.0 / self.n_states)
        probs = torch.empty(B, self.config.vocab_size, dtype=torch.float64)
        T_all = self.transition_matrices("all")
        emit = self.emission_matrix()
        for cc in concepts.unique().tolist():  # a handful: one batched pass each
            rows = (concepts == cc).nonzero().squeeze(1)
            probs[rows] = next_token_distribution(
                inputs[rows], T_all[cc : cc + 1], emit, init[rows]
            )[:, 0]
        return probs

    def decode(self, tokens: torch.Tensor) -> str:
        """A token sequence ``(T,)`` as text, with the names of :func:`token_names`."""
        tokens = check_tensor("tokens", tokens, ndim=1, integer=True)
        names = token_names(self.config.vocab_size)
        return " ".join(names[t] for t in tokens.tolist())

    def __repr__(self) -> str:
        c = self.config
        return (
            f"GINC(entities={c.n_entities}, properties={c.n_properties}, "
            f"vocab={c.vocab_size}, concepts={c.n_seen} seen + "
            f"{c.n_concepts - c.n_seen} unseen, seed={c.seed})"
        )


def smoothed_documents(
    world: GINC, n: int, length: int, g: torch.Generator, eps: float
) -> torch.Tensor:
    """``n`` documents of ``length`` tokens ``(n, length)`` from the seen concepts'
    eps-smoothed HMMs: each step follows the concept's transitions, except that with
    probability ``eps`` the next hidden state is drawn uniformly from all states (the
    transition matrix ``(1 - eps) T_c + eps / H`` the smoothed Bayes predictor
    assumes). ``eps = 0`` gives the world's own documents in distribution."""
    n = check_int("n", n, minimum=1)
    length = check_int("length", length, minimum=1)
    eps = check_float("eps", eps, minimum=0.0, maximum=1.0)
    c = world.config
    P, H = c.n_properties, c.n_states
    pool = world.seen_concepts
    concept = pool[torch.randint(len(pool), (n,), generator=g)]
    first = torch.rand(n, generator=g, dtype=torch.float64).unsqueeze(1)
    h = torch.searchsorted(world.start_probs[concept].cumsum(1), first, right=True)
    h = h.squeeze(1).clamp_(max=H - 1)
    e, s = h // P, h % P
    cdf_e = world.entity_transition.cumsum(1)
    cdf_p = world.property_transitions.cumsum(2)
    u = torch.rand(max(length - 1, 0), 4, n, generator=g, dtype=torch.float64)
    target = torch.randint(0, H, (max(length - 1, 0), n), generator=g)

    def draw(cdf, v):
        i = torch.searchsorted(cdf, v.unsqueeze(1), right=True).squeeze(1)
        return i.clamp_(max=cdf.shape[1] - 1)

    states = [e * P + s]
    for t in range(length - 1):
        e, s = draw(cdf_e[e], u[t, 0]), draw(cdf_p[concept, s], u[t, 1])
        jump = u[t, 2] < eps
        e = torch.where(jump, target[t] // P, e)
        s = torch.where(jump, target[t] % P, s)
        states.append(e * P + s)
    return world.state_tokens[torch.stack(states, 1)]


def ginc_bayes_predictor(
    world,
    tokens: torch.Tensor,
    epsilon: float,
    concepts="seen",
    dtype: torch.dtype = torch.float64,
) -> BayesPrediction:
    """The Bayes-optimal in-context predictor of a GINC world's pretraining
    distribution.

    The prior is uniform over ``concepts`` (by default the pretraining concepts), each
    with its start law and transitions smoothed by ``epsilon``
    (:func:`smooth_transitions`). ``epsilon = 0`` is the unsmoothed pretraining
    distribution, under which most prompts with examples are impossible.
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    epsilon = check_float("epsilon", epsilon, minimum=0.0, maximum=1.0)
    idx = world.concept_indices(concepts)
    T = smooth_transitions(world.transition_matrices(idx), epsilon).to(dtype)
    emit = world.emission_matrix().to(dtype)
    tokens, T, O3, mu = _check_hmm(tokens, T, emit, world.start_probs[idx].to(dtype))
    la = forward_log_alpha_deterministic(tokens, T, world.state_tokens, mu).permute(
        1, 0, 2
    )  # (C, B, H)
    return _posterior_predictive_from_alpha(la, T, O3, None)


def distinguishability(
    world, example_length: int, epsilon: float, n_segments: int = 200, seed: int = 0
) -> torch.Tensor:
    r"""The sufficient condition of Chapter 6's concentration theorem, estimated by
    sampling.

    For a prompt concept :math:`c^\star` and start property :math:`s_0`, a *segment* is
    a delimiter followed by one example. With smoothed transitions (``epsilon``),

    .. math::
        D(c^\star, s_0, c) = \mathbb{E}_{\text{seg}}\Big[\log \min_h
        p_{c^\star}(\text{seg}\mid h)
        - \log \max_h p_{c}(\text{seg}\mid h)\Big],

    the expectation over segments of the prompt distribution (``n_segments`` samples).
    If :math:`D > 0` for every :math:`c \neq c^\star`, the posterior concentrates on
    :math:`c^\star` exponentially fast in the number of examples.

    Returns a tensor ``(C, P - 1, C)`` indexed ``[c_star, s0 - 1, c]`` over the
    pretraining concepts (the diagonal is not meaningful).
    """
    if not isinstance(world, GINC):
        raise TypeError(f"world must be a GINC, got {type(world).__name__}")
    k = check_int("example_length", example_length, minimum=2)
    epsilon = check_float("epsilon", epsilon, minimum=0.0, maximum=1.0)
    n_segments = check_int("n_segments", n_segments, minimum=1)
    g = make_generator(check_int("seed", seed, minimum=0))
    seen = world.seen_concepts
    P = world.config.n_properties
    segs = []
    for c in seen.tolist():
        for s0 in range(1, P):
            pr = world.sample_prompts(
                n_segments, 0, k, g, concepts=torch.tensor([c]), start_property=s0
            )
            segs.append(pr.examples[:, 0])
    segs = torch.stack(segs)  # (C, P - 1, n_segments, k)
    delim = torch.full(segs.shape[:-1] + (1,), DELIMITER, dtype=segs.dtype)
    tokens = torch.cat([delim, segs], dim=-1).reshape(-1, k + 1)
    T = smooth_transitions(world.transition_matrices(seen), epsilon)
    lb = log_likelihood_given_state(tokens, T, world.emission_matrix())  # (N, C, H)
    C = len(seen)
    low = lb.amin(dim=2).reshape(C, P - 1, n_segments, C)  # log min_h p_c(seg | h)
    high = lb.amax(dim=2).reshape(C, P - 1, n_segments, C)  # log max_h p_c(seg | h)
    own = low.diagonal(dim1=0, dim2=3).permute(
        2, 0, 1
    )  # (C*, P-1, n): log min_h p_{c*}
    return (own.unsqueeze(-1) - high).mean(dim=2)
