"""A small MNIST-style digit classifier (the model file of an eager-mode archive)."""

import torch
from torch import nn


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 13 * 13, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return torch.log_softmax(self.fc(x.flatten(1)), dim=1)
