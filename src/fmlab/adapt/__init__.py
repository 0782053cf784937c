"""Adaptation methods shared by the chapters: linear probes, ridge-classifier probes
and fine-tuning of a linear head (:mod:`.probes`) and low-rank adaptation
(:mod:`.lora`)."""

from .lora import LoRALinear, apply_lora, lora_targets, only_targets_trainable
from .probes import (
    fine_tune_linear_head_adam,
    linear_probe,
    ridge_probe_accuracy,
    ridge_probe_curve,
    ridge_probe_head,
)

__all__ = [
    "LoRALinear",
    "apply_lora",
    "lora_targets",
    "only_targets_trainable",
    "fine_tune_linear_head_adam",
    "linear_probe",
    "ridge_probe_head",
    "ridge_probe_accuracy",
    "ridge_probe_curve",
]
