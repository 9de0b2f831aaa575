"""The paper's MNIST / Fashion-MNIST models: a linear classifier and a small CNN."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from torch import Tensor, nn

from probust.models._layers import Normalize


class LinearClassifier(nn.Module):
    """One linear layer from the flattened input to the class logits.

    Maps ``[B, *input_shape]`` float32 in [0, 1] to logits ``[B, num_classes]``.
    """

    arch = "linear"

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 28, 28),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.normalize = Normalize(mean, std, channels=input_shape[0])
        self.fc = nn.Linear(prod(input_shape), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.normalize(x).flatten(1))


def cnn_padding(input_shape: Sequence[int], pool: bool = True) -> int:
    """Padding of the CNN's two 5x5 convolutions for a given ``(C, H, W)``.

    With pooling: 0 (28x28 -> 24 -> 12 -> 8 -> 4, 320 features, the layout of PyTorch's MNIST
    example) when the smaller side is at least 16, which leaves a feature map of at least 1x1;
    otherwise 2 ("same" convolutions: 8x8 -> 8 -> 4 -> 4 -> 2, 80 features) so that
    scikit-learn's 8x8 digits fit. Without pooling: 0 from 12x12 up (28 -> 24 -> 20, 8000
    features), else 2 (8x8 stays 8x8, 1280 features).
    """
    h, w = input_shape[-2:]
    smallest = 4 if pool else 1
    if min(h, w) < smallest:
        raise ValueError(f"the CNN needs inputs of at least {smallest}x{smallest} pixels, got {h}x{w}")
    return 0 if min(h, w) >= (16 if pool else 12) else 2


class SmallCNN(nn.Module):
    """The paper's CNN: conv 5x5 (10 ch) -> max-pool 2 -> ReLU -> conv 5x5 (20 ch) -> max-pool 2
    -> ReLU -> linear (50) -> ReLU -> linear (num_classes).

    Maps ``[B, *input_shape]`` float32 in [0, 1] to logits ``[B, num_classes]``; padding is
    chosen by :func:`cnn_padding`.

    The paper lists the layers (two 5x5 convolutions with 10 and 20 channels, a 50-unit layer, the
    output layer) without saying whether there is pooling. The default follows PyTorch's MNIST
    example, which has exactly these layers with 2x2 max-pooling (21,840 weights at 28x28);
    ``pool=False`` takes the list literally (no pooling, 405,840 weights at 28x28: slower, and
    about half a point more accurate on Fashion-MNIST). ``dropout`` > 0 adds the example's
    dropout layers (channel dropout after the second convolution, dropout after the 50-unit
    layer); they act only in training mode, so the estimators see a deterministic network.
    """

    arch = "cnn"

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 28, 28),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dropout: float = 0.0,
        pool: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        c, h, w = input_shape
        pad = cnn_padding(input_shape, pool)
        # Identity and p=0 dropout keep one set of state_dict keys for every option.
        pooling = nn.MaxPool2d if pool else (lambda _: nn.Identity())
        self.normalize = Normalize(mean, std, channels=c)
        self.features = nn.Sequential(
            nn.Conv2d(c, 10, kernel_size=5, padding=pad),
            pooling(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, kernel_size=5, padding=pad),
            nn.Dropout2d(dropout),
            pooling(2),
            nn.ReLU(),
        )
        for _ in range(2):  # each 5x5 convolution: size + 2 pad - 4; each pooling: floor half
            h, w = h + 2 * pad - 4, w + 2 * pad - 4
            h, w = (h // 2, w // 2) if pool else (h, w)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(20 * h * w, 50),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(50, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(self.normalize(x)))
