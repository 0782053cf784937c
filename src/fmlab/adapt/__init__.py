"""Adaptation methods shared by the chapters: linear probes and fine-tuning of a linear
head (:mod:`.probes`) and low-rank adaptation (:mod:`.lora`)."""

from .lora import LoRALinear, apply_lora, lora_targets, only_targets_trainable
from .probes import fine_tune_linear_head_adam, linear_probe

__all__ = [
    "LoRALinear",
    "apply_lora",
    "lora_targets",
    "only_targets_trainable",
    "fine_tune_linear_head_adam",
    "linear_probe",
]
