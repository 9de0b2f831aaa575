"""ResNet18 with the usual CIFAR stem (He et al. 2016, as trained in the paper on CIFAR)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from probust._extras import import_extra
from probust.models._layers import Normalize


class ResNet18(nn.Module):
    """torchvision's ResNet18 for small images: a 3x3 stride-1 first convolution and no max-pool.

    Maps ``[B, *input_shape]`` float32 in [0, 1] to logits ``[B, num_classes]``; the input is
    normalised by a :class:`Normalize` layer inside the model.
    """

    arch = "resnet18"

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (3, 32, 32),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        channels = input_shape[0]
        self.normalize = Normalize(mean, std, channels=channels)
        torchvision = import_extra("torchvision", extra="data", feature="the resnet18 architecture")
        net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
        # The ImageNet stem (7x7 stride 2 + max-pool) would shrink 32x32 inputs to 8x8 at once.
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.normalize(x))
