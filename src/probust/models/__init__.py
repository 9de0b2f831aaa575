"""The paper's models, a registry by name, and loading/saving of any model file.

Architectures (:data:`ARCHS`), each mapping float32 ``[B, *input_shape]`` in [0, 1] to logits
``[B, num_classes]`` with input normalisation as a layer inside the model:

* ``linear``: one linear layer on the flattened input (the paper's MNIST/FMNIST linear model).
* ``cnn``: conv 5x5 (10) -> pool -> conv 5x5 (20) -> pool -> linear 50 -> linear C; padding 0
  for inputs of at least 16x16, "same" (2) below that, e.g. for 8x8 digits.
* ``resnet18``: torchvision's ResNet18 with a CIFAR stem (3x3 stride-1 conv, no max-pool).
* ``vit``: a Hugging Face ViT (``pip install probust[vit]``), pretrained or from a small config.

Example:
    >>> model = probust.models.build("cnn", num_classes=10, input_shape=(1, 28, 28))
    >>> probust.models.save_checkpoint("m.pt", model, {"dataset": "fashion-mnist"})
    >>> model, meta = probust.models.load_model("m.pt", expect_num_classes=10)
"""

from probust.models._checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    check_compatible,
    probust_version,
    read_checkpoint,
    save_checkpoint,
    sidecar_path,
)
from probust.models._layers import Normalize
from probust.models._model_files import ExportedModel, load_model
from probust.models._registry import ARCHS, build, check_arch, spec_of
from probust.models._resnet import ResNet18
from probust.models._small import LinearClassifier, SmallCNN, cnn_padding

__all__ = [
    "ARCHS",
    "CheckpointError",
    "CheckpointMismatchError",
    "ExportedModel",
    "LinearClassifier",
    "Normalize",
    "ResNet18",
    "SmallCNN",
    "build",
    "check_arch",
    "check_compatible",
    "cnn_padding",
    "load_model",
    "probust_version",
    "read_checkpoint",
    "save_checkpoint",
    "sidecar_path",
    "spec_of",
]
