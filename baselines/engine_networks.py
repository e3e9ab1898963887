"""The suite engine's networks beside the actor: the critic (``ValueModel``: a backbone plus a float32 value head,
optionally with its own LoRA adapters), the frozen reference as the actor's base with the adapters off
(``AdapterOffReference``: no second copy of the weights), and the helpers that freeze a network or switch its
dropout off (the first update's ratio is then exactly 1)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from bench.execution.context import RunContext
from bench.model.loading import load_sequence_classifier


class ValueModel(nn.Module):
    """A critic: a transformer backbone (no LM head) plus a scalar value head.

    ``hidden(...)`` -> (b, L, H); ``values(hidden)`` turns hidden states (b, T, H) into values (b, T) in reward
    units. The head is float32 whatever the backbone's dtype (values and returns are small regressions), and it
    computes in float32 under autocast too: ``values`` switches autocast off for it, so one process (which calls
    ``values`` outside the backbone's autocast) and DDP (which runs ``forward``, head included, inside it) give the
    same values.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1, dtype=torch.float32)
        # N+ details: a reward/value head initialised N(0, 1/sqrt(d_model + 1)), bias 0.
        nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.head.bias)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               position_ids: torch.Tensor) -> torch.Tensor:
        """Shape: (b, L) each -> (b, L, H)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        return out.last_hidden_state

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shape: (b, T, H) -> (b, T) float32, autocast or not."""
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                completion_length: int) -> torch.Tensor:
        """Values of the last ``completion_length`` positions, each read before its token: (b, L) -> (b, T).

        What ``Engine.values`` computes, as one call: the form DistributedDataParallel needs (it syncs gradients of
        what runs through the wrapper's forward)."""
        hidden = self.hidden(input_ids, attention_mask, position_ids)
        return self.values(hidden[:, -completion_length - 1: -1])


def disable_dropout(model: nn.Module) -> None:
    """Zero every dropout probability (nn.Dropout modules and attention-dropout attributes)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: a network that is only read."""
    model.eval()
    model.requires_grad_(False)
    return model


def build_critic(ctx: RunContext, init: str, lora: bool = False) -> ValueModel:
    """A trained value model in float32 (fp32 master weights), on its own backbone.

    init 'policy': the policy checkpoint's base model (LM head dropped), a fresh head.
    init 'reward_model': the reward model's base model, and its score head copied into the value head.
    lora: the backbone gets train.lora's adapters and its own weights are frozen, so they are stored as a frozen
    network is (bf16 under a bfloat16 spec, bench.model.precision); the adapters and the value head are float32 and
    trained.
    """
    from transformers import AutoModel

    from bench.model.loading import torch_dtype
    from bench.model.precision import storage_dtype

    dtype = storage_dtype(ctx.spec.model.dtype, trained=not lora)
    if init == "policy":
        backbone = AutoModel.from_pretrained(str(ctx.init_model_dir), dtype=torch_dtype(dtype))
        critic = ValueModel(backbone, backbone.config.hidden_size)
    else:
        reward_model = load_sequence_classifier(ctx.reward_model_dir, ctx.spec.model.dtype, "cpu", trained=not lora)
        backbone = getattr(reward_model, reward_model.base_model_prefix)
        critic = ValueModel(backbone, backbone.config.hidden_size)
        with torch.no_grad():
            critic.head.weight.copy_(reward_model.score.weight.float())
    critic.requires_grad_(True)
    if lora:
        from baselines.common import add_lora

        critic.backbone = add_lora(critic.backbone, ctx.spec, task_type=None)  # freezes the backbone only
    return critic.to(ctx.device)


class AdapterOffReference(nn.Module):
    """The reference of a LoRA actor: the actor's own base model with its adapters switched off.

    ``forward(**inputs)`` runs the base under peft's ``disable_adapter()``, in which every LoRA layer computes
    exactly its frozen base layer: the starting checkpoint's outputs, bit for bit, at the cost of no weights.
    ``parameters()`` lists the actor's base model (adapters included, though unused), the very tensors the actor
    holds, so the accounting counts them once under the actor and reports them here as ``shared_params``.
    ``train()`` / ``eval()`` leave the modules alone: they are the actor's, whose mode the engine sets itself.
    """

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.model = actor.get_base_model()
        object.__setattr__(self, "_actor", actor)  # not a submodule: its parameters are listed once, via model

    def forward(self, **inputs: Any) -> Any:
        with self._actor.disable_adapter():
            return self.model(**inputs)

    def train(self, mode: bool = True) -> "AdapterOffReference":
        return self


# ----------------------------------------------------------------------------------------------
# A rollout batch (b completions, group by group; P padded prompt length; T completion length; V vocabulary)
