r"""A two-view latent-class model: the pretraining distribution of Chapter 1.

A latent class :math:`c \in \{1, \dots, K\}` is drawn uniformly. The example has two
parts that share it,

.. math::
    x_A = \mu_c + \sigma_A \varepsilon_A \in \mathbb{R}^{d_A}, \qquad
    x_B = \nu_c + \sigma_B \varepsilon_B \in \mathbb{R}^{d_B},

with standard normal noise. Pretraining hides :math:`x_B` and asks a model to predict it
from :math:`x_A` (a masked-prediction, self-supervised loss). Because everything is
Gaussian given :math:`c`, the posterior :math:`p(c \mid x_A)` and hence the
Bayes-optimal prediction :math:`\mathbb{E}[x_B \mid x_A] = \sum_c p(c \mid x_A)\, \nu_c`
are exact.

A downstream task labels each latent class with :math:`s_c \in \{-1, +1\}`; the task is
to predict :math:`y = s_c` from :math:`x_A`. With :math:`d_A` small and :math:`K` large,
:math:`y` is far from a linear function of :math:`x_A`, but it is a linear function of
the posterior, which a good pretrained representation carries.

Used in Chapter 1 (``notebooks/01-pretraining-and-adaptation.ipynb``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_float, check_int, check_tensor
from ..repro import make_generator

__all__ = ["TwoViewConfig", "TwoViewLatentModel"]


@dataclass(frozen=True)
class TwoViewConfig:
    """Parameters of :class:`TwoViewLatentModel`.

    ``seed`` fixes the class means (the "world"); samples use their own generators.
    """

    n_classes: int = 16
    dim_a: int = 4
    dim_b: int = 24
    noise_a: float = 0.35
    noise_b: float = 0.5
    seed: int = 0

    def __post_init__(self):
        check_int("n_classes", self.n_classes, minimum=2)
        check_int("dim_a", self.dim_a, minimum=1)
        check_int("dim_b", self.dim_b, minimum=1)
        check_float("noise_a", self.noise_a, minimum=0.0, strict_min=True)
        check_float("noise_b", self.noise_b, minimum=0.0)
        check_int("seed", self.seed, minimum=0)


class TwoViewLatentModel:
    """The pretraining distribution and its downstream tasks (see the module doc)."""

    def __init__(self, config: TwoViewConfig = TwoViewConfig()):
        if not isinstance(config, TwoViewConfig):
            raise TypeError(
                f"config must be a TwoViewConfig, got {type(config).__name__}"
            )
        self.config = config
        g = make_generator(config.seed)
        self.means_a = torch.randn(
            config.n_classes, config.dim_a, generator=g, dtype=torch.float64
        )
        self.means_b = torch.randn(
            config.n_classes, config.dim_b, generator=g, dtype=torch.float64
        )

    # -- sampling -----------------------------------------------------------------
    def sample(
        self, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` draws: classes ``(n,)``, ``x_A`` ``(n, d_A)``, ``x_B`` ``(n, d_B)``.

        Inputs are float32 (what models consume); the latent classes are int64.
        """
        n = check_int("n", n, minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        cfg = self.config
        c = torch.randint(cfg.n_classes, (n,), generator=generator)
        xa = self.means_a[c] + cfg.noise_a * torch.randn(
            n, cfg.dim_a, generator=generator, dtype=torch.float64
        )
        xb = self.means_b[c] + cfg.noise_b * torch.randn(
            n, cfg.dim_b, generator=generator, dtype=torch.float64
        )
        return c, xa.float(), xb.float()

    # -- exact Bayesian quantities ------------------------------------------------
    def posterior(self, xa: torch.Tensor) -> torch.Tensor:
        r"""Exact :math:`p(c \mid x_A)` for every row of ``xa``, shape ``(n, K)``."""
        xa = check_tensor(
            "xa", xa, shape=(None, self.config.dim_a), floating=True
        ).double()
        sq = torch.cdist(xa, self.means_a).pow(2)
        return torch.softmax(-sq / (2 * self.config.noise_a**2), dim=1)

    def bayes_prediction(self, xa: torch.Tensor) -> torch.Tensor:
        r"""The Bayes prediction :math:`\mathbb{E}[x_B \mid x_A]`, ``(n, d_B)``."""
        return self.posterior(xa) @ self.means_b

    def optimal_pretraining_loss(self, n: int = 200_000, seed: int = 12345) -> float:
        r"""The smallest population pretraining loss any predictor of ``x_B`` can reach.

        The loss is the mean squared error per coordinate of ``x_B``. Its minimum is
        :math:`\sigma_B^2 + \mathbb{E}\,\mathrm{tr}\,\mathrm{Cov}(\nu_c \mid x_A) /
        d_B`; the posterior covariance is exact, and the outer expectation is a Monte
        Carlo average over ``n`` fresh inputs.
        """
        n = check_int("n", n, minimum=1)
        _, xa, _ = self.sample(n, make_generator(seed))
        post = self.posterior(xa)
        mean = post @ self.means_b
        second = post @ self.means_b.pow(2).sum(1)
        var = (second - mean.pow(2).sum(1)).mean().item()
        return self.config.noise_b**2 + var / self.config.dim_b

    # -- downstream tasks ---------------------------------------------------------
    def task_signs(self, task_seed: int) -> torch.Tensor:
        r"""A balanced labelling :math:`s \in \{-1,+1\}^K` of the latent classes."""
        task_seed = check_int("task_seed", task_seed, minimum=0)
        K = self.config.n_classes
        perm = torch.randperm(K, generator=make_generator(task_seed))
        s = torch.ones(K, dtype=torch.float64)
        s[perm[: K // 2]] = -1.0
        return s

    def bayes_task_loss(
        self, signs: torch.Tensor, n: int = 200_000, seed: int = 54321
    ) -> float:
        r"""The smallest population squared loss of any predictor of ``y = s_c``.

        Equals :math:`\mathbb{E}\,\mathrm{Var}(s_c \mid x_A) = 1 - \mathbb{E}[(\sum_c
        p(c\mid x_A) s_c)^2]`.
        """
        signs = check_tensor(
            "signs", signs, shape=(self.config.n_classes,), floating=True
        )
        n = check_int("n", n, minimum=1)
        _, xa, _ = self.sample(n, make_generator(seed))
        m = self.posterior(xa) @ signs.double()
        return (1.0 - m.pow(2)).mean().item()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"TwoViewLatentModel(K={c.n_classes}, d_A={c.dim_a}, d_B={c.dim_b}, "
            f"sigma_A={c.noise_a}, sigma_B={c.noise_b}, seed={c.seed})"
        )
