"""Chapter 4 end to end: pretrain a masked LM, fine-tune it few-shot, compare with
kernels.

Pretraining minimises the masked-language-modelling loss on documents of
:class:`~fmlab.data.sentiment_language.SentimentLanguage` with a
:class:`~fmlab.models.transformer.TinyTransformer`. A downstream sentiment task is then
solved in two *settings* (Section 3.1 of Malladi et al., 2023):

- **prompt-based**: the input is ``[CLS] <sentence> it was [MASK] .`` and the model
  output is the difference of the label-word logits at ``[MASK]``, :math:`f(x) =
  \\text{logit}_{great} - \\text{logit}_{terrible}`
  (:class:`~fmlab.models.transformer.PromptClassifier`);
- **standard**: the input is ``[CLS] <sentence>`` and a new linear head reads the
  ``[CLS]`` position, :math:`f(x) = \\Gamma^\\top h_{[CLS]}(x) + c`
  (:class:`~fmlab.models.transformer.CLSClassifier`). The head starts fresh, at random
  (Remark 5.4 and Appendix C.4 of the paper: the setting in which the theory expects
  fine-tuning to leave its kernel); the *linear-probing* solution
  (:func:`~.ch4_world.logistic_probe_head`) is fitted and scored beside it.

With labels :math:`y \\in \\{\\pm 1\\}` and the logistic loss :math:`\\log(1 + e^{-y
f})`, binary cross-entropy over the two label words depends on :math:`f` only, so one
scalar output (and one kernel) describes each setting. Fine-tuning is full-batch SGD,
Adam or SignGD (:func:`~.ch4_world.fine_tune_logistic`); the kernel analogs are fitted
by kernel logistic regression (:func:`fmlab.theory.kernels.fit_kernel_logistic`). Every
learning rate and every ridge is chosen on a validation set of the same size as the
training set (``k`` examples per class), never on the test set
(:func:`~.ch4_fewshot.run_kernel_experiment`).

The code lives in four modules, and a page imports each name from the module that
defines it: :mod:`.ch4_world` (pretraining, the tasks, fine-tuning, the linear models),
:mod:`.ch4_kernel_behaviour` (kernel regression, the measures of kernel behaviour, the
checks of Theorem 4.3, LoRA's kernel and Definition 5.3), :mod:`.ch4_fewshot` (the
few-shot runs and their grids: :func:`~.ch4_fewshot.few_shot_runs`,
:func:`~.ch4_fewshot.lazy_grid`, :func:`~.ch4_fewshot.wide_grid`) and this one, which
holds the other runners of the pages (:func:`setting`, :func:`bag_of_words_accuracy`,
:func:`signgd_steps`, :func:`width_test`, :func:`bayes_output_derivative`,
:func:`lora_kernel`, :func:`entk_timing`, :func:`label_word_swap`): each returns what
one section of a chapter page shows.
The checks of the comparisons page 04's running text states are in
:mod:`.ch4_checks`.

Used in Chapter 4: ``notebooks/04-kernel-view.ipynb`` (the kernel view tested on
few-shot runs) and ``notebooks/04b-natural-tasks-and-lora.ipynb`` (natural tasks,
LoRA's kernel and the cost of an eNTK).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._validate import check_float, check_int
from ..data.sentiment_language import SentimentLanguage, SentimentLanguageConfig
from ..models.transformer import (
    PromptClassifier,
    TinyTransformer,
)
from ..repro import make_generator
from .ch4_kernel_behaviour import (
    LoRAKernelErrors,
    entk_accuracy,
    lora_kernel_errors,
    output_derivative_by_width,
    signgd_step_check,
)
from .ch4_world import (
    FewShotTask,
    MLMPretrainConfig,
    few_shot_task,
    fit_logistic_regression,
    output_derivative,
    outputs,
    pretrain_masked_lm,
    sign_accuracy,
    test_set,
)

__all__ = [
    "ChapterConfig",
    "Setting",
    "setting",
    "bag_of_words_accuracy",
    "best_multiple_residual",
    "SignGDSteps",
    "signgd_steps",
    "bayes_output_derivative",
    "LoRAKernelConfig",
    "LoRAKernel",
    "lora_kernel",
    "entk_timing",
    "LabelWords",
    "label_word_swap",
    "width_test",
]


# -- the chapter's pages: the setting, and runners that return what a section shows
# ---------
@dataclass(frozen=True)
class ChapterConfig:
    """The pretrained models and the shared test set of Chapter 4 (both pages).

    The model of the experiments is :attr:`pretrain` (seed 0); the width test of
    naturalness pretrains every seed of ``pretrain_seeds`` at width ``d_model`` and at
    the narrow width ``narrow`` (for ``narrow_steps`` steps).
    """

    prior_positive: float = 0.8  # share of positive pretraining documents
    d_model: int = 32
    pretrain_steps: int = 2000
    pretrain_seeds: tuple[int, ...] = (0, 1, 2)
    narrow: int = 16
    narrow_steps: int = 3000
    n_test: int = 1000

    def __post_init__(self):
        check_float("prior_positive", self.prior_positive, minimum=0.0, maximum=1.0)
        for name in ("d_model", "pretrain_steps", "narrow", "narrow_steps"):
            check_int(name, getattr(self, name), minimum=1)
        if not isinstance(self.pretrain_seeds, tuple) or not self.pretrain_seeds:
            raise ValueError("pretrain_seeds must be a non-empty tuple")
        check_int("n_test", self.n_test, minimum=2)

    @property
    def pretrain(self) -> MLMPretrainConfig:
        """The pretraining of the model of the experiments (seed 0)."""
        return MLMPretrainConfig(
            language=SentimentLanguageConfig(prior_positive=self.prior_positive),
            d_model=self.d_model,
            steps=self.pretrain_steps,
        )

    @property
    def widths(self) -> tuple[int, int]:
        """The two widths of the naturalness test, narrow first."""
        return (self.narrow, self.d_model)


@dataclass
class Setting:
    """The language, the pretrained model of the experiments and the shared test set
    (:func:`setting`)."""

    config: ChapterConfig
    lang: SentimentLanguage
    mlm: TinyTransformer
    pretrain_losses: torch.Tensor  # the masked-LM loss at every pretraining step
    test: FewShotTask
    prompt_model: PromptClassifier  # f_prompt with the label words great / terrible
    zero_shot: float  # test accuracy of the prompt, no example seen
    bayes_accuracy: float  # Bayes-optimal accuracy on the task
    n_params: int  # parameters of the prompt-based model


def setting(config: ChapterConfig = ChapterConfig()) -> Setting:
    """Pretrain (or load from the cache) the model of the experiments, draw the test
    set, and score the zero-shot prompt; see :class:`Setting`. At seed offset 0 the
    page's model is read from the book's stored file instead
    (:func:`~.ch4_natural_stored.stored_pretraining`)."""
    from .ch4_natural_stored import stored_pretraining

    if not isinstance(config, ChapterConfig):
        raise TypeError(f"config must be a ChapterConfig, got {type(config).__name__}")
    lang = SentimentLanguage(config.pretrain.language)
    mlm, losses = stored_pretraining(config.pretrain) or pretrain_masked_lm(
        config.pretrain
    )
    test = test_set(lang, config.n_test)
    prompt_model = PromptClassifier(mlm, lang)
    zero_shot = sign_accuracy(outputs(prompt_model, test.x_prompt), test.y)
    return Setting(
        config=config,
        lang=lang,
        mlm=mlm,
        pretrain_losses=losses,
        test=test,
        prompt_model=prompt_model,
        zero_shot=zero_shot,
        bayes_accuracy=lang.bayes_accuracy(),
        n_params=sum(p.numel() for p in prompt_model.parameters()),
    )


def bag_of_words_accuracy(
    lang: SentimentLanguage, n: int = 20_000, *, reg: float = 1e-3, seed: int = 99
) -> float:
    """Test accuracy of a linear bag of words (logistic regression on word counts,
    ridge ``reg``) trained on ``n`` task reviews and tested on ``n`` others."""
    if not isinstance(lang, SentimentLanguage):
        raise TypeError(f"lang must be a SentimentLanguage, got {type(lang).__name__}")
    n = check_int("n", n, minimum=1)
    s, w, _ = lang.sample_sentences(2 * n, make_generator(seed), domain="task")
    bow_w, bow_b = fit_logistic_regression(
        lang.bag_of_words(w[:n]), s[:n].double(), reg=reg
    )
    return sign_accuracy(
        (lang.bag_of_words(w[n:]).double() @ bow_w + bow_b).float(), s[n:].float()
    )


def best_multiple_residual(change: torch.Tensor, column: torch.Tensor) -> float:
    """:math:`\\lVert a - c\\,k\\rVert / \\lVert a\\rVert` for the best scalar
    :math:`c`: how well a multiple of the kernel column ``k`` describes the change
    ``a``."""
    c = (change @ column) / (column @ column)
    return float((change - c * column).norm() / change.norm())


@dataclass
class SignGDSteps:
    """Output of :func:`signgd_steps`: Theorem 4.3 checked on single steps."""

    lrs: tuple
    checks: list  # one SignGDStepCheck per training example
    errors: np.ndarray  # (example, lr): relative error of the A-SignGD prediction
    entk_residual: np.ndarray  # (example, lr): best multiple of the eNTK column


def signgd_steps(
    s: Setting,
    lrs: tuple[float, ...],
    *,
    n_examples: int = 3,
    n_eval: int = 100,
    shots: int = 16,
) -> SignGDSteps:
    """One SignGD step on each of the first ``n_examples`` examples of the first
    ``shots``-shot training set, evaluated on ``n_eval`` test sentences, for each
    learning rate (:func:`signgd_step_check`); with the eNTK column's best multiple
    for contrast."""
    train = few_shot_task(s.lang, shots, seed=0)
    checks = [
        signgd_step_check(
            s.prompt_model,
            train.x_prompt[i],
            float(train.y[i]),
            s.test.x_prompt[:n_eval],
            lrs,
        )
        for i in range(check_int("n_examples", n_examples, minimum=1))
    ]
    return SignGDSteps(
        lrs=tuple(lrs),
        checks=checks,
        errors=np.array([c.rel_error for c in checks]),
        entk_residual=np.array(
            [[best_multiple_residual(a, c.k_sgd) for a in c.actual] for c in checks]
        ),
    )


def bayes_output_derivative(
    lang: SentimentLanguage, n: int = 200_000, *, seed: int = 321
) -> float:
    """Mean :math:`|\\chi|` of the Bayes posterior's log-odds on ``n`` task reviews:
    the floor of the output derivative that no model can go below."""
    s, w, _ = lang.sample_sentences(n, make_generator(seed), domain="task")
    return float(
        output_derivative(lang.log_odds(w, domain="task"), s.double()).abs().mean()
    )


@dataclass(frozen=True)
class LoRAKernelConfig:
    """The LoRA kernel study: the lemma at ``rank`` (projection seed 0), and the error
    of the projected kernel for every rank in ``ranks`` over ``projections`` random
    projections, on the training sentences of the first ``shots``-shot run."""

    rank: int = 8
    ranks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    projections: int = 20
    shots: int = 16


@dataclass
class LoRAKernel:
    """Output of :func:`lora_kernel`."""

    lemma_difference: float  # max |K(LoRA model) - projection formula| / max |formula|
    errors: LoRAKernelErrors
    max_input_dim: int  # the largest input dimension of an adapted matrix


def lora_kernel(
    s: Setting, config: LoRAKernelConfig = LoRAKernelConfig()
) -> LoRAKernel:
    """The LoRA lemma (the eNTK of the LoRA model, by ``torch.func`` on the factors,
    against :func:`~fmlab.theory.kernels.lora_projected_kernel` of the weight
    gradients) and the theorem's errors (:func:`lora_kernel_errors`)."""
    from ..adapt.lora import apply_lora, weight_gradients
    from ..theory.kernels import empirical_ntk, lora_projected_kernel

    x = few_shot_task(s.lang, config.shots, seed=0).x_prompt
    lora = apply_lora(s.prompt_model, config.rank, seed=0)
    grads = weight_gradients(s.prompt_model, x)
    k_model = empirical_ntk(lora, x)
    k_formula = lora_projected_kernel(
        grads, grads, {name: lora.get_submodule(name).lora_A.detach() for name in grads}
    )
    return LoRAKernel(
        lemma_difference=float(
            (k_model - k_formula).abs().max() / k_formula.abs().max()
        ),
        errors=lora_kernel_errors(
            s.prompt_model, x, config.ranks, seeds=tuple(range(config.projections))
        ),
        max_input_dim=max(g.shape[2] for g in grads.values()),
    )


def entk_timing(s: Setting, n: int = 64, *, repeats: int = 3) -> dict:
    """:func:`fmlab.theory.kernels.time_entk` on the kernel of the weight matrices of
    the transformer blocks (LoRA's targets), for ``n`` test sentences."""
    from ..adapt.lora import only_targets_trainable
    from ..theory.kernels import time_entk

    return time_entk(
        only_targets_trainable(s.prompt_model), s.test.x_prompt[:n], repeats=repeats
    )


@dataclass
class LabelWords:
    """Output of :func:`label_word_swap`."""

    zero_shot: float  # test accuracy of the prompt with the new label words
    chi: float  # mean |chi| at theta_0 on the test set, new label words
    entk: np.ndarray  # eNTK accuracy per run, new label words
    entk_natural: np.ndarray  # the same runs with great / terrible


def label_word_swap(
    s: Setting,
    label_words: tuple[str, str] = ("movie", "film"),
    *,
    shots: int = 16,
    seeds: tuple[int, ...] = (0, 1, 2),
) -> LabelWords:
    """The prompt with other label words: its zero-shot accuracy and :math:`|\\chi|`,
    and eNTK regression (:func:`entk_accuracy`) with them and with the natural ones."""
    unnatural = PromptClassifier(s.mlm, s.lang, label_words=label_words)
    f = outputs(unnatural, s.test.x_prompt)
    runs = [few_shot_task(s.lang, shots, seed) for seed in seeds]
    return LabelWords(
        zero_shot=sign_accuracy(f, s.test.y),
        chi=output_derivative(f, s.test.y).abs().mean().item(),
        entk=np.array(entk_accuracy(unnatural, runs, s.test)),
        entk_natural=np.array(entk_accuracy(s.prompt_model, runs, s.test)),
    )


def width_test(config: ChapterConfig = ChapterConfig()) -> dict:
    """:func:`output_derivative_by_width` for the chapter's models: every seed of
    ``config.pretrain_seeds`` at the narrow width (``narrow_steps`` steps) and at
    ``d_model`` (``pretrain_steps``), on the chapter's test set. At seed offset 0 the
    page's width test is read from the book's stored file instead, with its
    ``"stored"`` record added (:func:`~.ch4_natural_stored.stored_width_test`)."""
    from .ch4_natural_stored import stored_width_test

    if not isinstance(config, ChapterConfig):
        raise TypeError(f"config must be a ChapterConfig, got {type(config).__name__}")
    call = dict(
        widths=config.widths,
        seeds=config.pretrain_seeds,
        steps=(config.narrow_steps, config.pretrain_steps),
        n_test=config.n_test,
    )
    return stored_width_test(config.pretrain, **call) or output_derivative_by_width(
        config.pretrain, **call
    )
