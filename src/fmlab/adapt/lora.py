"""LoRA: low-rank updates of a model's weight matrices (Hu et al., 2022), and its
kernel.

A LoRA layer keeps the pretrained weight :math:`W_0 \\in \\mathbb{R}^{d_{out} \\times
d_{in}}` frozen and learns :math:`W = W_0 + BA` with :math:`B \\in \\mathbb{R}^{d_{out}
\\times k}` initialised to zero and :math:`A \\in \\mathbb{R}^{k \\times d_{in}}` with
i.i.d. :math:`\\mathcal N(0, 1/k)` entries, so that :math:`\\mathbb{E}[A^\\top A] = I`.
At the start of fine-tuning the gradient with respect to :math:`B` is :math:`\\nabla_W
f\\, A^\\top`: the full gradient seen through a random projection, whose kernel is the
full one up to a Johnson-Lindenstrauss error of order :math:`1/\\sqrt{k}` (Theorem 7.2
of Malladi et al., 2023; :func:`fmlab.theory.kernels.lora_projected_kernel`).

Used in Chapter 4 (``notebooks/04-kernel-view.ipynb``).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

from .._validate import check_int, check_tensor
from ..repro import make_generator
from ..theory.kernels import jacobian

__all__ = [
    "LoRALinear",
    "apply_lora",
    "lora_targets",
    "only_targets_trainable",
    "weight_gradients",
]


class LoRALinear(nn.Module):
    """``base(x) + x A^T B^T``: a frozen linear layer plus a trainable rank-``k``
    update."""

    def __init__(self, base: nn.Linear, rank: int, generator: torch.Generator):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(
                f"base must be a torch.nn.Linear, got {type(base).__name__}"
            )
        rank = check_int("rank", rank, minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator, got {type(generator).__name__}"
            )
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank = rank
        self.lora_A = nn.Parameter(
            torch.randn(rank, base.in_features, generator=generator) / rank**0.5
        )
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T


def lora_targets(
    model: nn.Module, include: Callable[[str, nn.Linear], bool] | None = None
) -> list[str]:
    """Names of the ``nn.Linear`` modules LoRA adapts (default: every one inside
    ``blocks``, i.e. the attention and MLP weights of a transformer, not its embeddings
    or decoder)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    include = include or (
        lambda name, mod: "blocks." in name or name.startswith("blocks")
    )
    return [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and include(name, mod)
    ]


def apply_lora(
    model: nn.Module, rank: int, *, seed: int, targets: list[str] | None = None
) -> nn.Module:
    """A copy of ``model`` in which only LoRA factors train.

    Every module named in ``targets`` (default :func:`lora_targets`) becomes a
    :class:`LoRALinear`; all other parameters are frozen. At initialisation the copy
    computes exactly what ``model`` computes (because :math:`B = 0`).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rank = check_int("rank", rank, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    targets = lora_targets(model) if targets is None else list(targets)
    if not targets:
        raise ValueError("targets must name at least one nn.Linear module")
    adapted = copy.deepcopy(model)
    for p in adapted.parameters():
        p.requires_grad_(False)
    g = make_generator(seed)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = adapted.get_submodule(parent_name) if parent_name else adapted
        base = getattr(parent, child, None)
        if not isinstance(base, nn.Linear):
            raise ValueError(f"targets: {name!r} is not an nn.Linear of model")
        setattr(parent, child, LoRALinear(base, rank, g))
    return adapted


def only_targets_trainable(
    model: nn.Module, targets: list[str] | None = None
) -> nn.Module:
    """A copy of ``model`` in which only the weights and biases of the ``nn.Linear``
    modules in ``targets`` (default :func:`lora_targets`: the weight matrices of the
    transformer blocks) train; everything else is frozen. Its eNTK is the kernel of
    those matrices, the kernel that every per-example-gradient method of Chapter 4's
    timing section can compute (:func:`fmlab.theory.kernels.time_entk`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    targets = lora_targets(model) if targets is None else list(targets)
    if not targets:
        raise ValueError("targets must name at least one nn.Linear module")
    out = copy.deepcopy(model)
    for p in out.parameters():
        p.requires_grad_(False)
    for name in targets:
        mod = out.get_submodule(name)
        if not isinstance(mod, nn.Linear):
            raise ValueError(f"targets: {name!r} is not an nn.Linear of model")
        for p in mod.parameters():
            p.requires_grad_(True)
    return out


def weight_gradients(
    model: nn.Module,
    x: torch.Tensor,
    targets: list[str] | None = None,
    *,
    chunk_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Per-example gradients :math:`\\nabla_W f(x)` of the weight matrices in
    ``targets``.

    Returns layer name -> Tensor ``(n, d_out, d_in)`` for a model with scalar outputs.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    x = check_tensor("x", x, finite=False)
    targets = lora_targets(model) if targets is None else list(targets)
    probe = copy.deepcopy(model)
    for p in probe.parameters():
        p.requires_grad_(False)
    shapes = {}
    for name in targets:
        mod = probe.get_submodule(name)
        if not isinstance(mod, nn.Linear):
            raise ValueError(f"targets: {name!r} is not an nn.Linear of model")
        mod.weight.requires_grad_(True)
        shapes[name] = tuple(mod.weight.shape)
    jac = jacobian(probe, x, chunk_size=chunk_size)
    if jac.ndim != 2:
        raise ValueError("weight_gradients needs a model with one output per example")
    out, start = {}, 0
    for name, _ in ((n, None) for n, p in probe.named_parameters() if p.requires_grad):
        layer = name.rsplit(".", 1)[0]
        size = shapes[layer][0] * shapes[layer][1]
        out[layer] = jac[:, start : start + size].reshape(-1, *shapes[layer])
        start += size
    return out
