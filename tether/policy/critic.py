"""A value model for PPO/GAE: the policy's backbone with a scalar head per token."""

from __future__ import annotations

import torch


class ValueModel(torch.nn.Module):
    def __init__(self, path) -> None:
        from transformers import AutoModel  # (the model classes: imported where a model is built)

        super().__init__()
        self.backbone = AutoModel.from_pretrained(str(path))
        self.head = torch.nn.Linear(self.backbone.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1)  # [B, T]
