"""A small EmbeddingBag text classifier (the model file of an eager-mode text archive)."""

import torch
from torch import nn

VOCAB_SIZE = 40


class BagClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB_SIZE, 8, mode="mean")
        self.fc = nn.Linear(8, 3)

    def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(text, offsets))
