"""A value model for PPO/GAE: the policy's backbone with a scalar head per token."""

from __future__ import annotations

import torch


class ValueModel(torch.nn.Module):
    def __init__(self, path, dtype: str = "float32") -> None:
        from transformers import AutoModel  # (the model classes: imported where a model is built)

        super().__init__()
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.backbone = AutoModel.from_pretrained(str(path), dtype=torch_dtype)
        self.head = torch.nn.Linear(self.backbone.config.hidden_size, 1, dtype=torch_dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden).squeeze(-1).float()  # [B, T], float32 for the value loss
