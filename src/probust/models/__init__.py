"""The paper's models, a registry by name, and loading/saving of any model file.

Architectures (:data:`ARCHS`), each mapping float32 ``[B, *input_shape]`` in [0, 1] to logits
``[B, num_classes]`` with input normalisation as a layer inside the model:

* ``linear``: one linear layer on the flattened input (the paper's MNIST/FMNIST linear model).
* ``cnn``: conv 5x5 (10) -> pool -> conv 5x5 (20) -> pool -> linear 50 -> linear C; padding 0
  for inputs of at least 16x16, "same" (2) below that, e.g. for 8x8 digits.
* ``resnet18``: torchvision's ResNet18 with a CIFAR stem (3x3 stride-1 conv, no max-pool).
* ``vit``: a Hugging Face ViT (``pip install 'probust[hf]'``), pretrained or from a small config.
* ``mlp``: a multilayer perceptron on flat inputs of any shape (tables), standardising each feature.

Models from the user's code: :func:`build_from_factory` (``package.module:function``) and
:func:`load_weights` (a state_dict file); :func:`output_problem` says what is wrong with an
output that is not logits ``[B, C]``. :func:`load_hf_classifier` reads a Hugging Face image
classifier saved with ``save_pretrained`` (``pip install probust[hf]``), offline.

Models that expect normalised inputs (timm, torchvision, Hugging Face): :class:`Normalize`
(``probust.Normalize(mean, std)``) puts the normalisation inside the model, so that sigma stays in
pixel units, and :func:`with_normalization` puts it in front of a model from where the statistics
are written (a timm model's ``pretrained_cfg``, torchvision weights, a Hugging Face processor)::

    model = probust.with_normalization(timm.create_model("resnet18"))  # (x - mean) / std inside

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
from probust.models._factory import build_from_factory, is_factory, load_weights, output_problem
from probust.models._hf import HF_PREFIX, HFImageClassifier, hf_normalization, load_hf_classifier
from probust.models._layers import Normalize, StatisticsError, with_normalization
from probust.models._mlp import MLP
from probust.models._model_files import ExportedModel, load_model
from probust.models._registry import ARCHS, FLAT_ARCHS, build, check_arch, spec_of
from probust.models._resnet import ResNet18
from probust.models._small import LinearClassifier, SmallCNN, cnn_padding

__all__ = [
    "ARCHS",
    "FLAT_ARCHS",
    "HF_PREFIX",
    "HFImageClassifier",
    "MLP",
    "CheckpointError",
    "CheckpointMismatchError",
    "ExportedModel",
    "LinearClassifier",
    "Normalize",
    "ResNet18",
    "SmallCNN",
    "StatisticsError",
    "build",
    "build_from_factory",
    "check_arch",
    "check_compatible",
    "cnn_padding",
    "hf_normalization",
    "is_factory",
    "load_weights",
    "output_problem",
    "load_hf_classifier",
    "load_model",
    "probust_version",
    "read_checkpoint",
    "save_checkpoint",
    "sidecar_path",
    "spec_of",
    "with_normalization",
]
