"""The model sweep: real model code from torchvision, transformers, Ultralytics and rfdetr (random weights, small
configs, no downloads) exported with both exporters at the default and the lowest opset each supports, with a
dynamic image size and batch, run in ONNX Runtime at the exported size, another size and another batch, compared
with eager -- once without opbridge and once with it, each in a fresh process (``import opbridge`` changes the
exporters for the whole process). Each export's node count and ONNX Runtime's session load time are kept.

``python -m opbridge models`` (``nox -s models``) runs it and writes docs/models.md; every case has an id that
replays it alone (``--case with:torchvision.keypointrcnn_resnet50_fpn:legacy17``). Outcomes: ok / fixed batch /
fixed size / wrong result / ORT refuses / export fails / eager fails / timeout / unavailable (the model's library
is not installed), with the cause in one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

#: Outcomes, best first (a case's "no worse with opbridge" is checked in this order).
#: "fixed size": the graph matches eager at the exported image size but not at another one, because the model's
#: own code turned its image size into constants (the TorchScript tracer records Python arithmetic on sizes as
#: numbers; torch.export specializes a size the code guards on); the cause names where.
#: "fixed batch": right at another image size, not at another batch (the model's code baked its batch).
OUTCOMES = (
    "ok", "fixed batch", "fixed size", "wrong result", "ORT refuses", "export fails", "eager fails", "timeout",
    "unavailable",
)  # fmt: skip
#: (exporter, opset) of every model: the TorchScript-based exporter at its lowest opset with GridSample/RoiAlign
#: (11) and at torch's default for it (17), the dynamo exporter at its lowest (18) and its default (20).
EXPORTS = (("legacy", 11), ("legacy", 17), ("dynamo", 18), ("dynamo", 20))
RTOL, ATOL = 1e-3, 1e-4
#: The libraries of the cases, in the report's order.
_LIBRARIES = ("torchvision", "transformers", "ultralytics", "rfdetr")
#: The model dtypes a sweep can run in (``--dtype``), and their tolerances against torch's own forward in that dtype:
#: a float16 model's ONNX Runtime output is another float16 computation of the same graph, whose roundings differ.
DTYPES = ("float32", "float16")
TOLERANCES = {"float32": (RTOL, ATOL), "float16": (2e-2, 2e-2)}
#: The batch of the exported example and of the size check, and the other batch of the batch check. torch.export
#: specializes a dimension of size 1 (its 0/1 rule), so the example's batch is 2.
BATCH, OTHER_BATCH = 2, 3
#: A graph that grows by more nodes than this with opbridge is named in the report.
GROWTH = 20


@dataclass(frozen=True)
class ModelCase:
    """A model of another library: ``build()`` -> (module in eval mode, example inputs (tuple), inputs at another
    image size, inputs at the example's size and another batch (None where the inputs have no batch dimension:
    torchvision's detectors take a list of images)); ``dynamic`` names each image input's dynamic dims, the batch
    (dim 0) added where the case has batch inputs."""

    name: str
    library: str
    task: str
    build: Callable[[], tuple]
    dynamic: dict[int, dict[int, str]]
    #: whether opbridge serves an op in it (patch_model or an export rule): timed with and without
    served: bool = False
    #: in the fast subset that `nox -s tests` runs
    fast: bool = False


def _image(size: int, batch: int = 1, channels: int = 3, frames: int | None = None, seed: int = 0):
    import torch

    generator = torch.Generator().manual_seed(size + 1000 * seed)
    shape = (batch, channels, frames, size, size) if frames else (batch, channels, size, size)
    return torch.rand(shape, generator=generator)


def _torchvision(builder: str, size: int, other: int, **kwargs):
    def build():
        import torch
        import torchvision

        torch.manual_seed(0)
        model = getattr(torchvision.models, builder, None) or _submodule_builder(builder)
        module = model(weights=None, **kwargs).eval()
        if builder.endswith("_fpn") or builder.startswith(("ssd", "fcos", "retinanet")):
            if "mobilenet" in builder:
                _unit_scale_convolutions(module, ([_image(size)[0]],))
            return module, ([_image(size)[0]],), ([_image(other)[0]],), None
        frames = 4 if builder.startswith(("r3d", "mc3", "r2plus1d")) else None
        images = 2 if builder.startswith("raft") else 1

        def inputs(at: int, batch: int):
            return tuple(_image(at, batch, frames=frames, seed=seed) for seed in range(images))

        return module, inputs(size, BATCH), inputs(other, BATCH), inputs(size, OTHER_BATCH)

    return build


def _unit_scale_convolutions(module, inputs) -> None:
    """Scales each convolution's and batch norm's weight (and bias) so that its output has unit standard deviation
    on ``inputs``, in one forward pass in network order (a data-dependent init): a random network's activations
    neither vanish nor explode (transformers' PP-DocLayout draws even its batch norms' weights from N(0, 0.01))."""
    import torch

    def rescale(layer, _, output):
        if not isinstance(output, torch.Tensor) or output.numel() < 2:
            return None
        scale = output.detach().std().clamp_min(1e-30)
        with torch.no_grad():
            layer.weight.div_(scale)
            if getattr(layer, "bias", None) is not None:
                layer.bias.div_(scale)
        return output / scale

    def scaled(layer) -> bool:
        weight = getattr(layer, "weight", None)
        return isinstance(layer, torch.nn.Conv2d) or (
            "BatchNorm" in type(layer).__name__ and isinstance(weight, torch.Tensor) and weight.dim() == 1
        )

    hooks = [layer.register_forward_hook(rescale) for layer in module.modules() if scaled(layer)]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for hook in hooks:
            hook.remove()


def _submodule_builder(builder: str):
    import torchvision

    for package in ("detection", "segmentation", "video", "optical_flow"):
        found = getattr(getattr(torchvision.models, package), builder, None)
        if found is not None:
            return found
    raise AttributeError(f"torchvision.models has no {builder}")


def _transformers(model_class: str, config: Callable[[], object], size: int, other: int, extra=None):
    def build():
        import torch
        import transformers

        torch.manual_seed(0)
        module = _HuggingFaceWrapper(getattr(transformers, model_class)(config()).eval(), extra).eval()
        # Random convolutional backbones (HGNet, ResNet) let features vanish: the two-stage DETRs' query
        # selection (top-k of encoder scores) then picks among ties, in an order ORT and torch need not share.
        _unit_scale_convolutions(module, (_image(size),))
        return module, (_image(size, BATCH),), (_image(other, BATCH),), (_image(size, OTHER_BATCH),)

    return build


class _HuggingFaceWrapper(torch.nn.Module):
    """A transformers model as a function of pixel_values returning its first output tensor (exporters need
    tensors out; ModelOutput dataclasses export, but a plain tensor keeps the comparison simple)."""

    def __init__(self, model, extra=None) -> None:
        super().__init__()
        self.model = model
        # Other inputs (token ids) are made once, outside forward (a generator traced in forward would not export),
        # and kept as buffers: constants of the exported graph, as a deployed model with a fixed prompt has them.
        self.extra_names = list(extra or {})
        for name, make in (extra or {}).items():
            self.register_buffer(f"extra_{name}", make(), persistent=False)

    def forward(self, pixel_values):
        if hasattr(self.model, "language_cache_class"):  # OmDet-Turbo keeps text embeddings, graph and all
            for name in ("language_cache_class", "language_cache_prompt"):
                setattr(self.model, name, type(getattr(self.model, name))(self.model.config.cache_size))
        # Each image gets the same prompt: the extras are made for one image and repeated along the batch
        # (OmDet-Turbo's class prompts and their structure too, as its processor lays out a batch).
        batch = pixel_values.shape[0]
        extra = {}
        for name in self.extra_names:
            value = getattr(self, f"extra_{name}")
            extra[name] = value.repeat(batch, *([1] * (value.dim() - 1)))
        out = self.model(pixel_values=pixel_values, **extra)
        # The first output that goes through the model's deformable attention: Mask2Former's first output is its
        # backbone's last map, which the exporters would export without the pixel decoder.
        for field in ("last_hidden_state", "pixel_decoder_last_hidden_state"):
            hidden = getattr(out, field, None)
            if hidden is not None:
                return hidden
        return out[0]


class _Predictions(torch.nn.Module):
    """An Ultralytics model, whose eval forward returns (predictions, raw outputs): its predictions, or for RT-DETR
    its last decoder layer's boxes and scores, before the post-processing's top-k over all queries and classes
    (random weights give scores that tie, and ties come out of a top-k in any order; ONNX Runtime's and torch's
    differ)."""

    def __init__(self, model, raw: bool) -> None:
        super().__init__()
        self.model = model
        self.raw = raw
        self._heads = [layer for layer in model.modules() if hasattr(layer, "dynamic")]  # a list: not submodules

    def forward(self, images):
        # Ultralytics' exporter (the TorchScript one: it passes dynamo=False) sets its heads' `dynamic` for a
        # dynamic export, so that they rebuild anchors from the traced sizes. torch.export's sizes are symbolic
        # anyway, and there `dynamic` makes the top-k's k a tensor, which torch.export cannot take: off.
        for head in self._heads:
            head.dynamic = torch.jit.is_tracing()
        predictions, raw = self.model(images)
        return (raw[0][-1], raw[1][-1]) if self.raw else predictions


def _ultralytics(config: str, size: int, other: int):
    """An Ultralytics model from the yaml its package ships (random weights, no download), its heads set as
    Ultralytics' own exporter sets them for ``dynamic=True`` (_Predictions)."""

    def build():
        import torch
        from ultralytics.nn import tasks

        torch.manual_seed(0)
        detr = config.startswith("rtdetr")
        kind = tasks.RTDETRDetectionModel if detr else tasks.OBBModel
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = kind(config, verbose=False).eval()
        _spread_constant_layers(model)
        module = _Predictions(model, raw=detr).eval()
        _unit_scale_convolutions(module, (_image(size),))
        return module, (_image(size, BATCH),), (_image(other, BATCH),), (_image(size, OTHER_BATCH),)

    return build


def _spread_constant_layers(model) -> None:
    """Draws the weights and biases that a library initializes to one value (Ultralytics' score and box heads: zero
    weights, one bias) from a normal distribution: at that initialization every query has the same score, the
    post-processing's top-k picks among ties, and ties come out in any order (ONNX Runtime's and torch's differ)."""
    import torch

    with torch.no_grad():
        for layer in model.modules():
            if not isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d)):
                continue
            if layer.weight.numel() > 1 and bool(layer.weight.min() == layer.weight.max()):
                layer.weight.normal_(0.0, layer.weight[0].numel() ** -0.5)
            bias = layer.bias
            if bias is not None and bias.numel() > 1 and bool(bias.min() == bias.max()):
                bias.normal_(float(bias[0]), 1.0)


def _rfdetr(model_class: str, size: int, other: int):
    """Roboflow's RF-DETR (the ``rfdetr`` package; random weights, no download) after its own ``export()``
    preparation, as its exporter runs it: a plain image batch in, (boxes, logits) out."""

    def build():
        import rfdetr
        import torch

        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            network = getattr(rfdetr, model_class)(pretrain_weights=None, device="cpu").model.model.eval()
            network.export()
        _unit_scale_convolutions(network, (_image(size),))
        return network, (_image(size, BATCH),), (_image(other, BATCH),), (_image(size, OTHER_BATCH),)

    return build


def _resnet_backbone():
    import transformers

    return transformers.ResNetConfig(
        num_channels=3,
        embeddings_size=10,
        hidden_sizes=[10, 20, 30, 40],
        depths=[1, 1, 2, 1],
        hidden_act="relu",
        out_features=["stage2", "stage3", "stage4"],
    )


def _rtdetr_common() -> dict:
    return dict(
        encoder_hidden_dim=32,
        feat_strides=[8, 16, 32],
        encoder_layers=1,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        d_model=32,
        num_queries=30,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        num_feature_levels=3,
        decoder_layers=2,
        decoder_attention_heads=2,
        num_denoising=0,
    )


def _rtdetr_resnet():
    import transformers

    return transformers.RTDetrResNetConfig(
        embeddings_size=10,
        hidden_sizes=[10, 20, 30, 40],
        depths=[1, 1, 2, 1],
        out_features=["stage2", "stage3", "stage4"],
    )


def _swin(image_size: int, embed_dim: int = 8, out_features=None):
    import transformers

    extra = {"out_features": out_features} if out_features else {"out_indices": [2, 3, 4]}
    return transformers.SwinConfig(
        window_size=7, embed_dim=embed_dim, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], image_size=image_size, **extra
    )


def _config(name: str, **fields):
    def make():
        import transformers

        return getattr(transformers, name)(**_resolve(fields))

    return make


def _resolve(fields: dict) -> dict:
    return {k: (v() if callable(v) else v) for k, v in fields.items()}


def _text_ids():
    import torch

    return torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(1))


def _task_ids():
    import torch

    return torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(2))


_BERT_TINY = {
    "model_type": "bert",
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 8,
    "max_position_embeddings": 16,
    "vocab_size": 128,
}
_CLIP_TEXT_TINY = {
    "model_type": "clip_text_model",
    "vocab_size": 99,
    "hidden_size": 16,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 8,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
_HGNET_SMALL = {
    "model_type": "hgnet_v2",
    "arch": "L",
    "return_idx": [0, 1, 2, 3],
    "hidden_sizes": [32] * 4,
    "stem_channels": [3, 32, 32],
    "stage_in_channels": [32] * 4,
    "stage_mid_channels": [32] * 4,
    "stage_out_channels": [32] * 4,
    "out_features": ["stage1", "stage2", "stage3", "stage4"],
}


#: Grounding DINO and MM Grounding DINO: the same small config.
_GROUNDING_DINO = dict(
    backbone_config=lambda: _swin(98),
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=8,
    decoder_ffn_dim=8,
    num_queries=4,
    num_feature_levels=4,
    encoder_n_points=2,
    decoder_n_points=3,
    max_text_len=7,
    text_config=lambda: dict(_BERT_TINY),
)


_STAGES_2_TO_4 = ["stage2", "stage3", "stage4"]
_PP_DOCLAYOUT_SMALL = {**{k: v for k, v in _rtdetr_common().items() if k != "d_model"},
                       "encoder_in_channels": [32, 32, 32], "decoder_ffn_dim": 8, "decoder_n_points": 4}  # fmt: skip


def _reading_order_config():
    from transformers.models.pp_doclayout_v2.configuration_pp_doclayout_v2 import PPDocLayoutV2ReadingOrderConfig

    return PPDocLayoutV2ReadingOrderConfig(
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=16,
        num_hidden_layers=1,
        max_position_embeddings=64,
        max_2d_position_embeddings=1024,
        coordinate_size=8,
        shape_size=8,
        num_classes=4,
        global_pointer_head_size=8,
    )


def _prompt_ids(rows: int, seed: int):
    return torch.randint(0, 99, (rows, 7), generator=torch.Generator().manual_seed(seed))


def _hgnet():
    import transformers

    return transformers.HGNetV2Config(
        stage_in_channels=[16, 64, 128, 256],
        stage_mid_channels=[16, 32, 64, 128],
        stage_out_channels=[64, 128, 256, 512],
        stage_num_blocks=[1, 1, 2, 1],
        stage_downsample=[False, True, True, True],
        stage_light_block=[False, False, True, True],
        stage_kernel_size=[3, 3, 5, 5],
        stage_numb_of_layers=[3, 3, 3, 3],
        embeddings_size=10,
        hidden_sizes=[64, 128, 256, 512],
        depths=[1, 1, 2, 1],
        out_features=["stage2", "stage3", "stage4"],
        stem_channels=[3, 16, 16],
        use_lab=True,
    )


#: transformers families with multi-scale deformable attention: model class -> (config factory, extra inputs).
#: tests/test_integrations.py checks that every family transformers marks with the kernel hook is here.
#: Mask2Former and OneFormer: the same small Swin backbone, pixel decoder and transformer decoder.
_MASK_FORMER = dict(
    backbone_config=lambda: _swin(224, 16, ["stage1", "stage2", "stage3", "stage4"]),
    hidden_dim=32,
    encoder_feedforward_dim=64,
    dim_feedforward=64,
    encoder_layers=1,
    decoder_layers=2,
    num_attention_heads=2,
    num_queries=10,
)
#: D-FINE and DEIMv2 (the same decoder): the same number of points on every level, which opbridge's op serves
#: (per-level counts run the library's own function).
_D_FINE = dict(
    backbone_config=lambda: _hgnet(),
    encoder_in_channels=[128, 256, 512],
    decoder_n_points=4,
    depth_mult=0.34,
    hidden_expansion=0.5,
    **_rtdetr_common(),
)


TRANSFORMERS_MSDA = {
    "DeformableDetrModel": (
        _config(
            "DeformableDetrConfig",
            backbone_config=_resnet_backbone,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            num_queries=10,
            num_feature_levels=4,
            encoder_n_points=2,
            decoder_n_points=3,
        ),
        None,
    ),
    "RTDetrModel": (
        _config(
            "RTDetrConfig",
            backbone_config=_rtdetr_resnet,
            encoder_in_channels=[20, 30, 40],
            decoder_n_points=4,
            **_rtdetr_common(),
        ),
        None,
    ),
    "GroundingDinoModel": (
        _config("GroundingDinoConfig", **_GROUNDING_DINO),
        {"input_ids": _text_ids},
    ),
    "MMGroundingDinoModel": (
        _config("MMGroundingDinoConfig", **_GROUNDING_DINO),
        {"input_ids": _text_ids},
    ),
    "LwDetrModel": (
        _config(
            "LwDetrConfig",
            backbone_config=lambda: __import__("transformers").LwDetrViTConfig(
                hidden_size=16,
                num_hidden_layers=4,
                num_attention_heads=2,
                window_block_indices=[0, 2],
                out_indices=[1, 3],
                num_windows=16,
                image_size=256,
            ),
            d_model=32,
            projector_scale_factors=[0.5, 2.0],
            decoder_ffn_dim=32,
            decoder_layers=1,
            decoder_self_attention_heads=2,
            decoder_cross_attention_heads=4,
            num_queries=10,
            group_detr=2,
        ),
        None,
    ),
    "RfDetrModel": (
        _config(
            "RfDetrConfig",
            backbone_config=lambda: __import__("transformers").RfDetrDinov2Config(
                hidden_size=32,
                num_hidden_layers=4,
                num_attention_heads=2,
                out_features=["stage2", "stage3"],
                patch_size=16,
                num_windows=2,
                image_size=256,
            ),
            d_model=32,
            decoder_ffn_dim=32,
            decoder_layers=1,
            decoder_self_attention_heads=2,
            decoder_cross_attention_heads=4,
            num_queries=10,
            group_detr=2,
        ),
        None,
    ),
    "PPDocLayoutV3ForObjectDetection": (
        _config(
            "PPDocLayoutV3Config",
            backbone_config=dict(_HGNET_SMALL),
            encoder_in_channels=[32, 32, 32],
            mask_feature_channels=[32, 32],
            x4_feat_dim=32,
            decoder_n_points=4,
            **{**_rtdetr_common(), "decoder_ffn_dim": 8},
        ),
        None,
    ),
    # PP-DocLayout v2 and v4 take a 3-level backbone (v3's mask branch takes a fourth); v2's reading-order head needs
    # its per-label thresholds and order (no defaults).
    "PPDocLayoutV2ForObjectDetection": (
        _config(
            "PPDocLayoutV2Config",
            backbone_config=lambda: {**_HGNET_SMALL, "return_idx": [1, 2, 3], "out_features": _STAGES_2_TO_4},
            reading_order_config=lambda: _reading_order_config(),
            d_model=32,
            num_labels=4,
            class_thresholds=[0.5] * 4,
            class_order=[0, 1, 2, 3],
            **_PP_DOCLAYOUT_SMALL,
        ),
        None,
    ),
    "PPDocLayoutV4ForObjectDetection": (
        _config(
            "PPDocLayoutV4Config",
            backbone_config=lambda: {**_HGNET_SMALL, "return_idx": [1, 2, 3], "out_features": _STAGES_2_TO_4},
            hidden_size=32,
            num_labels=4,
            global_pointer_head_size=8,
            gp_dropout_value=0.0,
            **_PP_DOCLAYOUT_SMALL,
        ),
        None,
    ),
    # OmDet-Turbo: a Swin backbone and a CLIP text model for class and task prompts (3 classes, 7 tokens).
    "OmDetTurboForObjectDetection": (
        _config(
            "OmDetTurboConfig",
            backbone_config=lambda: _swin(224),
            text_config=lambda: dict(_CLIP_TEXT_TINY),
            apply_layernorm_after_vision_backbone=False,  # it expects timm's channels-last maps
            image_size=224,
            encoder_in_channels=[16, 32, 64],
            encoder_hidden_dim=8,
            encoder_layers=1,
            encoder_projection_indices=[2],
            encoder_attention_heads=2,
            encoder_dim_feedforward=32,
            vision_features_channels=[8, 8, 8],
            decoder_hidden_dim=8,
            decoder_num_layers=2,
            decoder_num_heads=2,
            decoder_num_points=4,
            decoder_dim_feedforward=32,
            num_feature_levels=3,
            num_queries=20,
            task_encoder_hidden_dim=32,
            class_embed_dim=16,  # must differ from decoder_hidden_dim (else no task projection is built)
            text_projection_in_dim=16,
            text_projection_out_dim=16,
        ),
        {
            "classes_input_ids": lambda: _prompt_ids(3, 1),
            "classes_attention_mask": lambda: torch.ones(3, 7, dtype=torch.int64),
            "tasks_input_ids": lambda: _prompt_ids(1, 2),
            "tasks_attention_mask": lambda: torch.ones(1, 7, dtype=torch.int64),
            "classes_structure": lambda: torch.tensor([3]),
        },
    ),
    "RTDetrV2Model": (
        _config(
            "RTDetrV2Config",
            backbone_config=_rtdetr_resnet,
            encoder_in_channels=[20, 30, 40],
            decoder_n_points=4,
            decoder_n_levels=3,
            decoder_method="default",
            **_rtdetr_common(),
        ),
        None,
    ),
    "DFineModel": (_config("DFineConfig", **_D_FINE), None),
    "Deimv2Model": (_config("Deimv2Config", **_D_FINE), None),
    "Mask2FormerModel": (
        _config("Mask2FormerConfig", feature_size=32, mask_feature_size=32, **_MASK_FORMER),
        None,
    ),
    "OneFormerModel": (
        _config(
            "OneFormerConfig",
            conv_dim=32,
            mask_dim=32,
            **_MASK_FORMER,
            text_encoder_width=32,
            text_encoder_num_layers=1,
            task_seq_len=8,
            text_encoder_context_length=8,
            text_encoder_vocab_size=128,
        ),
        {"task_inputs": _task_ids},
    ),
}


def _cases() -> list[ModelCase]:
    cases = [
        ModelCase(
            "torchvision.resnet18",
            "torchvision",
            "classification",
            _torchvision("resnet18", 64, 96),
            {0: {2: "height", 3: "width"}},
            fast=True,
        ),
        ModelCase(
            "torchvision.mobilenet_v3_small",
            "torchvision",
            "classification",
            _torchvision("mobilenet_v3_small", 64, 96),
            {0: {2: "height", 3: "width"}},
        ),
        ModelCase(
            "torchvision.deeplabv3_mobilenet_v3_large",
            "torchvision",
            "segmentation",
            _torchvision("deeplabv3_mobilenet_v3_large", 96, 128, weights_backbone=None, aux_loss=False),
            {0: {2: "height", 3: "width"}},
        ),
        ModelCase(
            "torchvision.r3d_18", "torchvision", "video", _torchvision("r3d_18", 32, 48), {0: {3: "height", 4: "width"}}
        ),
        ModelCase(
            "torchvision.raft_small",
            "torchvision",
            "optical flow",
            _torchvision("raft_small", 128, 160),  # RAFT needs >= 128 px
            {0: {2: "height", 3: "width"}, 1: {2: "height", 3: "width"}},
        ),
    ]
    # Random weights put every detector's scores under its default threshold (an empty output matches anything)
    # or, for the MobileNet-based ones, make their features vanish (every score ties at 1/classes, and ties come
    # out in any order): thresholds low enough to keep detections, at most 20 of them, and those detectors'
    # convolutions scaled to keep their activations (_unit_scale_convolutions).
    detectors = {
        "fasterrcnn_mobilenet_v3_large_320_fpn": dict(box_score_thresh=0.0, box_detections_per_img=20),
        "retinanet_resnet50_fpn": dict(score_thresh=0.005, detections_per_img=20),
        "fcos_resnet50_fpn": dict(score_thresh=0.01, detections_per_img=20),
        "ssdlite320_mobilenet_v3_large": dict(num_classes=5, detections_per_img=20),
        "maskrcnn_resnet50_fpn": dict(box_score_thresh=0.0, box_detections_per_img=20),
        "keypointrcnn_resnet50_fpn": dict(box_score_thresh=0.0, box_detections_per_img=20),
    }
    for builder, kwargs in detectors.items():
        cases.append(
            ModelCase(
                f"torchvision.{builder}",
                "torchvision",
                "detection",
                _torchvision(builder, 320, 256, weights_backbone=None, **kwargs),
                {0: {1: "height", 2: "width"}},
            )
        )
    for model_class, (config, extra) in TRANSFORMERS_MSDA.items():
        size = 128 if not model_class.startswith(("LwDetr", "RfDetr")) else 256
        # LW-DETR's windowed ViT needs its patch grid divisible by the window grid (4 x 4 windows of 16-px patches)
        other = size + (64 if model_class.startswith("LwDetr") else 32)
        cases.append(
            ModelCase(
                f"transformers.{model_class}",
                "transformers",
                "detection (MSDA)",
                _transformers(model_class, config, size, other, extra),
                {0: {2: "height", 3: "width"}},
                served=True,
                fast=model_class == "DeformableDetrModel",
            )
        )
    # Other libraries' DETRs (and Ultralytics' oriented YOLO, whose rotated NMS is ProbIoU fast-NMS outside the
    # model, which no opbridge op computes: it is here to show that opbridge leaves it as it is).
    image = {0: {2: "height", 3: "width"}}
    cases += [
        ModelCase("ultralytics.rtdetr-l", "ultralytics", "detection (MSDA)", _ultralytics("rtdetr-l.yaml", 128, 160),
                  image, served=True),
        ModelCase("ultralytics.yolo11n-obb", "ultralytics", "oriented detection",
                  _ultralytics("yolo11n-obb.yaml", 128, 160), image),
        ModelCase("rfdetr.RFDETRNano", "rfdetr", "detection (MSDA)", _rfdetr("RFDETRNano", 224, 256), image,
                  served=True),
    ]  # fmt: skip
    for model_class, config_class, fields in (
        (
            "ViTModel",
            "ViTConfig",
            dict(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=64,
                patch_size=16,
            ),
        ),
        ("ConvNextModel", "ConvNextConfig", dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])),
        # window 2: transformers 5.23 Swin fails where a stage is smaller than its window (2x2 maps, window 4)
        ("SwinModel", "SwinConfig", dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=2)),
    ):
        size = 64
        dynamic = {0: {2: "height", 3: "width"}} if model_class != "ViTModel" else {}  # ViT: fixed position table
        cases.append(
            ModelCase(
                f"transformers.{model_class}",
                "transformers",
                "backbone",
                _transformers(
                    model_class, _config(config_class, **fields), size, size if model_class == "ViTModel" else size + 32
                ),
                dynamic,
            )
        )
    return cases


CASES = {case.name: case for case in _cases()}


# --- one case, in this process ----------------------------------------------------------------------------------


@dataclass
class Result:
    id: str
    model: str
    opbridge: bool
    exporter: str
    opset: int
    outcome: str
    cause: str = ""
    max_error: float | None = None
    seconds: float = 0.0
    eager_ms: float | None = None
    ort_ms: float | None = None
    #: nodes of the exported graph (its functions' and subgraphs' included) and ONNX Runtime's session load time
    nodes: int | None = None
    load_ms: float | None = None
    #: "dynamic" (right at another batch), "fixed" (not) or "" (not checked: no batch dimension, or not reached)
    batch: str = ""
    #: the dtype the model and its inputs were cast to before the export (``--dtype``)
    dtype: str = "float32"


def case_id(model: str, with_opbridge: bool, exporter: str, opset: int, dtype: str = "float32") -> str:
    """``with:torchvision.resnet18:legacy17``; a model cast to another dtype first ends in it (``...:float16``)."""
    suffix = "" if dtype == "float32" else f":{dtype}"
    return f"{'with' if with_opbridge else 'without'}:{model}:{exporter}{opset}{suffix}"


def parse_id(text: str) -> tuple[str, bool, str, int, str]:
    try:
        mode, model, export, *dtype = text.split(":")
        exporter = export.rstrip("0123456789")
        if mode not in ("with", "without") or len(dtype) > 1 or (dtype and dtype[0] not in DTYPES):
            raise ValueError
        return model, mode == "with", exporter, int(export[len(exporter) :]), (dtype or ["float32"])[0]
    except ValueError:
        raise ValueError(
            f"not a case id: {text!r} (expected e.g. with:torchvision.resnet18:legacy17, or ...:legacy17:float16)"
        ) from None


def _cast(value, dtype):
    """Floating tensors in ``value`` (a tensor, or tuples and lists of them) cast to ``dtype``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _flatten(output) -> list:
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _flatten(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in _flatten(v)]
    return []


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    if "## Exception summary" in lines:  # torch.onnx's TorchExportError: the summary names the real error
        lines = lines[lines.index("## Exception summary") + 1 :]
        return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
    text = next((line for line in lines if "Error" in line or "error" in line), lines[0] if lines else "")
    return f"{type(error).__name__}: {text}"[:300]


def run_case(
    model_name: str, with_opbridge: bool, exporter: str, opset: int, dtype: str = "float32", timing: bool = False
) -> Result:
    """Exports one model once and compares ORT with eager at the exported and the other image size; ``dtype``
    other than float32: the model and its inputs cast to it first (``model.half()``), eager in that dtype too."""
    import io
    import warnings

    import torch

    torch.set_num_threads(1)
    if with_opbridge:
        import opbridge
    case = CASES[model_name]
    result = Result(
        case_id(model_name, with_opbridge, exporter, opset, dtype), model_name, with_opbridge, exporter, opset, "ok",
        dtype=dtype,
    )  # fmt: skip
    rtol, atol = TOLERANCES[dtype]
    start = time.perf_counter()
    try:
        module, inputs, other_inputs, batch_inputs = case.build()
        module.eval()  # the whole module: an exporter restores the mode it finds, a wrapper's included
        if dtype != "float32":
            module.to(getattr(torch, dtype))
            inputs, other_inputs, batch_inputs = (_cast(i, getattr(torch, dtype)) for i in (inputs, other_inputs,
                                                                                            batch_inputs))  # fmt: skip
        if with_opbridge:
            opbridge.patch_model(module)
        with torch.no_grad():
            expected = [_flatten(module(*inputs)), _flatten(module(*other_inputs))]
            if batch_inputs is not None:
                expected.append(_flatten(module(*batch_inputs)))
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != case.library:
            return dataclasses.replace(result, outcome="eager fails", cause=_one_line(error))
        return dataclasses.replace(result, outcome="unavailable", cause=f"{case.library} is not installed here")
    except Exception as error:
        return dataclasses.replace(result, outcome="eager fails", cause=_one_line(error))
    input_names = [f"input{i}" for i in range(len(_flatten(inputs)))]
    dynamic = {i: ({0: "batch"} if batch_inputs is not None else {}) | dims for i, dims in case.dynamic.items()}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if exporter == "dynamo":
                shapes = []
                for i, example in enumerate(inputs):
                    dims = {d: torch.export.Dim.AUTO for d in dynamic.get(i, {})}
                    shapes.append([dims] if isinstance(example, list) else (dims or None))
                program = torch.onnx.export(
                    module,
                    inputs,
                    dynamo=True,
                    opset_version=opset,
                    verbose=False,
                    dynamic_shapes=tuple(shapes),
                    input_names=input_names,
                )
                proto = program.model_proto
                fixed = _specialized(program, dynamic)
            else:
                import onnx

                buffer = io.BytesIO()
                axes = {f"input{i}": dims for i, dims in dynamic.items()}
                torch.onnx.export(
                    module,
                    inputs,
                    buffer,
                    dynamo=False,
                    opset_version=opset,
                    input_names=input_names,
                    dynamic_axes=axes,
                )
                proto = onnx.load_from_string(buffer.getvalue())
                fixed = _first_tracer_warning(caught)
    except Exception as error:
        return dataclasses.replace(
            result, outcome="export fails", cause=_one_line(error), seconds=time.perf_counter() - start
        )
    result.nodes = count_nodes(proto)
    try:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        serialized = proto.SerializeToString()
        load = time.perf_counter()
        if with_opbridge:
            import opbridge_ort

            session = opbridge_ort.InferenceSession(serialized, options)
        else:
            session = onnxruntime.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
        result.load_ms = 1000 * (time.perf_counter() - load)
        names = [i.name for i in session.get_inputs()]

        def run(example):
            return session.run(None, dict(zip(names, (t.numpy() for t in _flatten(example)), strict=False)))

        got = run(inputs)
    except Exception as error:
        return dataclasses.replace(
            result, outcome="ORT refuses", cause=_one_line(error), seconds=time.perf_counter() - start
        )
    mismatch, worst = _compare(got, expected[0], rtol, atol)
    if mismatch:
        return dataclasses.replace(
            result, outcome="wrong result", max_error=worst, cause=mismatch, seconds=time.perf_counter() - start
        )

    def check(other, want) -> str | None:
        nonlocal worst
        try:
            mismatch, error_other = _compare(run(other), want, rtol, atol)
        except Exception as error:
            return f"ORT refuses it: {_one_line(error)}"
        worst = max(worst, error_other)
        return mismatch

    mismatch = check(other_inputs, expected[1])
    batch_mismatch = check(batch_inputs, expected[2]) if batch_inputs is not None else None
    result = dataclasses.replace(result, max_error=worst, seconds=time.perf_counter() - start)
    if batch_inputs is not None:
        result.batch = "fixed" if batch_mismatch else "dynamic"
    reported = fixed or "no size was reported fixed"
    if mismatch:
        size = "x".join(str(d) for d in _flatten(other_inputs)[0].shape[-2:])
        result.outcome = "fixed size"
        result.cause = f"matches at the exported size; at {size}: {mismatch}; {reported}"
        if batch_mismatch:
            result.cause += f"; at batch {OTHER_BATCH} too: {batch_mismatch}"
    elif batch_mismatch:
        result.outcome = "fixed batch"
        result.cause = (
            f"matches at batch {BATCH} (two image sizes); at batch {OTHER_BATCH}: {batch_mismatch}; {reported}"
        )
    if timing:  # at the exported size, where the graph is right
        result.eager_ms = _time_ms(lambda: module(*inputs))
        result.ort_ms = _time_ms(lambda: run(inputs))
    return result


def _compare(got: list, want: list, rtol: float = RTOL, atol: float = ATOL) -> tuple[str | None, float]:
    """(why ORT's outputs differ from eager's, or None; the largest absolute difference)."""
    import numpy as np

    if len(got) != len(want):
        return f"ORT gave {len(got)} outputs, eager {len(want)}", 0.0
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        w = w.numpy()
        if g.shape != w.shape:
            return f"output shape {list(g.shape)}, eager {list(w.shape)}", worst
        if w.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
        if w.dtype in (np.float16,) and g.dtype != w.dtype:  # a half model's outputs must come back half
            return f"output dtype {g.dtype}, eager {w.dtype}", worst
        close = np.isclose(g, w, rtol=rtol, atol=atol)
        if not close.all():
            share = 1.0 - float(close.mean())
            return f"max error {worst:.3g} > rtol {rtol} / atol {atol} ({share:.2g} of the elements)", worst
    return None, worst


def _short_path(path: str) -> str:
    """A source path as a reader knows it: from the package on (``transformers/models/...``), never a machine's."""
    path = path.replace(os.sep, "/")
    return path.split("site-packages/")[-1] if "site-packages/" in path else "/".join(path.split("/")[-2:])


def _first_tracer_warning(caught) -> str:
    """Where the TorchScript tracer turned a value of the model's code (not torch's) into a constant: a tensor
    made a constant or a number first, a Python boolean (a branch taken) after."""
    import torch

    found = []
    for warning in caught:
        where = warning.filename.replace(os.sep, "/")
        if issubclass(warning.category, torch.jit.TracerWarning) and "/torch/" not in where:
            text = str(warning.message).split(". ")[0]
            found.append((("boolean" in text), f"{_short_path(where)}:{warning.lineno} ({text})"))
    return f"the trace fixed a value at {min(found)[1]}" if found else ""


def count_nodes(proto) -> int:
    """Nodes of an ONNX model: its graph's, its subgraphs' (If, Loop, Scan) and its local functions'."""

    def graph_nodes(graph) -> int:
        total = 0
        for node in graph.node:
            total += 1
            for attribute in node.attribute:
                total += graph_nodes(attribute.g) if attribute.HasField("g") else 0
                total += sum(graph_nodes(g) for g in attribute.graphs)
        return total

    return graph_nodes(proto.graph) + sum(graph_nodes(function) for function in proto.functions)


def _specialized(program, dynamic: dict[int, dict[int, str]]) -> str:
    """Where torch.export fixed the image size or the batch: a dim meant to be dynamic became a number, or a tensor
    made from sizes became a constant of the graph (its first use in the model's code is named)."""
    try:
        exported = program.exported_program
        signature = exported.graph_signature
        placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
        user = [placeholders[name] for name in signature.user_inputs if name in placeholders]
        lifted = [placeholders[name] for name in signature.inputs_to_lifted_tensor_constants if name in placeholders]
    except Exception:  # another torch's ExportedProgram: say nothing rather than guess
        return ""
    for index, dims in dynamic.items():
        shape = getattr(user[index].meta.get("val"), "shape", None) if index < len(user) else None
        if shape is None:
            continue
        named = {name: shape[d] for d, name in dims.items() if d < len(shape)}
        if isinstance(named.get("batch"), int):
            return f"torch.export specialized the batch to {named['batch']}"
        if any(isinstance(v, int) for name, v in named.items() if name != "batch"):
            fixed = "x".join(str(v) for name, v in named.items() if name != "batch")
            return f"torch.export specialized the image size to {fixed}"
    for node in lifted:
        for use in node.users:
            frames = re.findall(r'File "([^"]+)", line (\d+)', use.meta.get("stack_trace", ""))
            frames = [(path, line) for path, line in frames if "/torch/" not in path.replace(os.sep, "/")]
            if frames:
                where = f"{_short_path(frames[-1][0])}:{frames[-1][1]}"
                return f"torch.export made a tensor built from sizes a constant of the graph (used at {where})"
    return ""


def _time_ms(call: Callable, repeats: int = 5) -> float:
    import torch

    with torch.no_grad():
        call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


# --- a served model at a realistic size ---------------------------------------------------------------------------


def speed(image: int = 512, threads: int = 1, repeats: int = 5) -> list[tuple[str, float, float]]:
    """Deformable DETR as published (d_model 256, 6 + 6 layers, 8 heads, 4 levels x 4 points, 300 queries; a
    ResNet-18 backbone, random weights) at ``image`` x ``image``: (what, without opbridge ms, with opbridge ms) for
    eager (transformers' grid_sample loop vs ``patch_model``) and ONNX Runtime (its GridSample export vs the custom
    node), all in one process, one after the other. Fails if the two disagree (float32, 1e-3)."""
    import io

    import onnx
    import onnxruntime
    import torch
    import transformers

    import opbridge
    import opbridge.onnx
    import opbridge_ort

    # opbridge's export rules in both runs (they are what `import opbridge` gives; without them ONNX Runtime refuses
    # this model: the TorchScript exporter types its GridSample grid float64); the "without" run exports
    # transformers' own grid_sample loop, the "with" run opbridge's node.
    opbridge._load()
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    backbone = transformers.ResNetConfig(
        depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    model = transformers.DeformableDetrModel(transformers.DeformableDetrConfig(backbone_config=backbone)).eval()
    inputs = (torch.randn(1, 3, image, image),)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads

    def exported(lowering: str) -> onnx.ModelProto:
        buffer = io.BytesIO()
        with opbridge.onnx.lowering(lowering), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=17, input_names=["pixel_values"])
        return onnx.load_from_string(buffer.getvalue())

    def timed_session(session) -> tuple[float, object]:
        feeds = {"pixel_values": inputs[0].numpy()}
        return _time_ms(lambda: session.run(None, feeds), repeats), session.run(None, feeds)

    with torch.no_grad():
        eager_without = _time_ms(lambda: model(*inputs), repeats)
        want = _flatten(model(*inputs))
    plain = onnxruntime.InferenceSession(
        exported("standard").SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    ort_without, got_without = timed_session(plain)
    opbridge.patch_model(model)
    with torch.no_grad():
        eager_with = _time_ms(lambda: model(*inputs), repeats)
        got = _flatten(model(*inputs))
    ort_with, got_with = timed_session(opbridge_ort.InferenceSession(exported("custom"), options))
    for name, outputs in (("eager with patch_model", got), ("ORT without", got_without), ("ORT custom", got_with)):
        if len(outputs) != len(want):
            raise AssertionError(f"{name}: {len(outputs)} outputs, eager {len(want)}")
        for value, expected in zip(outputs, want, strict=True):
            torch.testing.assert_close(torch.as_tensor(value), expected, rtol=1e-3, atol=1e-3, msg=f"{name} differs")
    return [
        ("eager", eager_without, eager_with),
        ("ONNX Runtime (TorchScript exporter, opset 17)", ort_without, ort_with),
    ]


def speed_markdown(rows: list[tuple[str, float, float]], image: int, threads: int) -> str:
    lines = [
        f"Deformable DETR as published (d_model 256, 6 + 6 layers, 300 queries, ResNet-18 backbone, random weights) "
        f"at {image}x{image}, {threads} thread(s), median of 5 (`python -m opbridge models --speed --image {image}`):",
        "",
        "| | without opbridge | with opbridge | speedup |",
        "|---|---|---|---|",
    ]
    lines += [f"| {what} | {a:.0f} ms | {b:.0f} ms | {a / b:.2f}x |" for what, a, b in rows]
    return "\n".join(lines)


# --- the sweep: one process per case ----------------------------------------------------------------------------


def run_isolated(identifier: str, timeout: float, timing: bool) -> Result:
    model, with_opbridge, exporter, opset, dtype = parse_id(identifier)
    command = [sys.executable, "-m", "opbridge", "models", "--case", identifier, "--json-line"]
    if timing:
        command.append("--timing")
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    except subprocess.TimeoutExpired:
        return Result(
            identifier, model, with_opbridge, exporter, opset, "timeout", f"over {timeout:.0f} s", None, timeout,
            dtype=dtype,
        )  # fmt: skip
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return Result(**json.loads(line))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return Result(
        identifier, model, with_opbridge, exporter, opset, "eager fails", f"the case crashed: {tail[:250]}",
        dtype=dtype,
    )  # fmt: skip


def select(models: Sequence[str] | None, fast: bool) -> list[ModelCase]:
    chosen = [c for c in CASES.values() if (not fast or c.fast)]
    if models:
        import fnmatch

        chosen = [c for c in chosen if any(fnmatch.fnmatch(c.name, m) for m in models)]
    return chosen


def sweep(
    cases: Sequence[ModelCase], exports=EXPORTS, timeout: float = 300, stream=sys.stdout, dtype: str = "float32"
) -> list[Result]:
    results = []
    for case in cases:
        for exporter, opset in exports:
            for with_opbridge in (False, True):
                identifier = case_id(case.name, with_opbridge, exporter, opset, dtype)
                timing = case.served and (exporter, opset) == exports[1] and dtype == "float32"
                result = run_isolated(identifier, timeout, timing=timing)
                results.append(result)
                print(
                    f"{result.outcome:12} {result.seconds:6.1f} s  {identifier}  {result.cause}",
                    file=stream,
                    flush=True,
                )
    return results


def regressions(results: Sequence[Result]) -> list[str]:
    """Cases that do worse with opbridge than without (by OUTCOMES order)."""
    by_key = {(r.model, r.exporter, r.opset, r.opbridge): r for r in results}
    found = []
    for (model, exporter, opset, with_opbridge), result in by_key.items():
        before = by_key.get((model, exporter, opset, False))
        if with_opbridge and before is not None and OUTCOMES.index(result.outcome) > OUTCOMES.index(before.outcome):
            found.append(f"{result.id}: {before.outcome} without opbridge, {result.outcome} with it ({result.cause})")
    return found


def markdown(results: Sequence[Result], environment: dict[str, str], seconds: float) -> str:
    dtypes = sorted({r.dtype for r in results} - {"float32"})
    title = "# Real models through both exporters into ONNX Runtime, without and with opbridge"
    half = []
    if dtypes:
        rtol, atol = TOLERANCES[dtypes[0]]
        title += f", in {', '.join(dtypes)}"
        half = [
            f"Each model and its inputs are cast to {', '.join(dtypes)} before the export (`model.half()`), and",
            f"ONNX Runtime's output is compared with torch's own forward in that dtype at rtol {rtol} / atol {atol}",
            "(two half-precision computations of the same graph round differently; a random-weight detector that",
            "ranks its queries by score may pick others in each, which makes a wrong result without and with",
            "opbridge alike). A half model's outputs must come back in the half dtype.",
            "",
        ]
    order = {library: i for i, library in enumerate(_LIBRARIES)}
    libraries = sorted(
        {CASES[r.model].library for r in results if r.model in CASES}, key=lambda n: (order.get(n, 9), n)
    )
    named = ", ".join(libraries[:-1]) + f" and {libraries[-1]}" if len(libraries) > 1 else "".join(libraries)
    compared = "with eager (see below)" if dtypes else "with eager (rtol 1e-3, atol 1e-4)"
    lines = [
        title,
        "",
        f"Generated by `python -m opbridge models` (`nox -s models`): models from {named} with random",
        "weights and small configs, exported at batch 2 with a dynamic image size and batch, run in ONNX Runtime at",
        f"the exported size, at another size and at batch 3, compared {compared}. Each case runs in a fresh",
        "process; `with` imports opbridge and applies",
        "`opbridge.patch_model(model)`. Replay a case with `python -m opbridge models --case ID`.",
        "",
        "Outcomes: **ok** (matches eager at both sizes and both batches; torchvision's detectors take a list of",
        "images, so they have no batch dimension to check); **fixed batch** (right at another size, not at another",
        "batch); **fixed size** (matches at the exported size, not at the other: the model's own code turned its",
        "image size into constants -- the TorchScript tracer records Python arithmetic on sizes as numbers,",
        "torch.export bakes a tensor built from sizes -- and the cause names the line); **wrong result**;",
        "**ORT refuses**; **export fails**; **eager fails**; **timeout**; **unavailable** (its library is not",
        "installed).",
        "A detector's outputs are its detections: thresholds are lowered so that random weights give some. Its",
        "masks and keypoints pass through rounding steps (box sizes in whole pixels), so float32 differences of",
        "1e-5 in a box can move a few of their elements past the tolerance: a wrong result that is the same without",
        "and with opbridge and touches a small share of the elements (given in the cause) is of this kind.",
        "",
        *half,
        f"Environment: {', '.join(f'{k} {v}' for k, v in environment.items())}; sweep time {seconds / 60:.1f} min.",
        "",
    ]
    problems = regressions(results)
    lines += [
        "**No model does worse with opbridge than without.**"
        if not problems
        else "**Regressions:** " + "; ".join(problems),
        "",
    ]
    exports = sorted({(r.exporter, r.opset) for r in results}, key=lambda e: (e[0] != "legacy", e[1]))
    header = "| model | " + " | ".join(f"{e} {o}: without → with" for e, o in exports)
    header += " | dynamic batch with opbridge (" + ", ".join(f"{e} {o}" for e, o in exports) + ") |"
    lines += [header, "|" + "---|" * (len(exports) + 2)]
    by_key = {(r.model, r.exporter, r.opset, r.opbridge): r for r in results}
    models = list(dict.fromkeys(r.model for r in results))
    for model in models:
        row = [f"`{model}`"]
        for exporter, opset in exports:
            before, after = by_key.get((model, exporter, opset, False)), by_key.get((model, exporter, opset, True))
            row.append(f"{before.outcome if before else '-'} → {after.outcome if after else '-'}")
        batches = [by_key.get((model, exporter, opset, True)) for exporter, opset in exports]
        marks = {"dynamic": "yes", "fixed": "no"}
        row.append(" / ".join(marks.get(r.batch, "-") if r else "-" for r in batches))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Causes", "", "| case | outcome | cause |", "|---|---|---|"]
    for r in results:
        if r.outcome != "ok":
            lines.append(f"| `{r.id}` | {r.outcome} | {_ANSI.sub('', r.cause).replace('|', '/')} |")
    lines += graph_size_markdown(results)
    timed = [r for r in results if r.eager_ms is not None]
    if timed:
        lines += [
            "",
            "## Time with and without opbridge (1 thread, median of 5, at the exported image size)",
            "",
            "At these small configs multi-scale deformable attention is a small part of a model's time, and the",
            "machine is shared: read these as checks that nothing got slower; the op's own speedups are in",
            "benchmarks.md.",
            "",
            "| model | export | eager without | eager with | ORT without | ORT with |",
            "|---|---|---|---|---|---|",
        ]
        pairs = {(r.model, r.exporter, r.opset, r.opbridge): r for r in timed}
        for (model, exporter, opset, with_opbridge), r in pairs.items():
            other = pairs.get((model, exporter, opset, False))
            if with_opbridge and other is not None:
                lines.append(
                    f"| `{model}` | {exporter} {opset} | {other.eager_ms:.1f} ms | {r.eager_ms:.1f} ms "
                    f"({other.eager_ms / r.eager_ms:.2f}x) | {other.ort_ms:.1f} ms | {r.ort_ms:.1f} ms "
                    f"({other.ort_ms / r.ort_ms:.2f}x) |"
                )
    return "\n".join(lines) + "\n"


def graph_size_markdown(results: Sequence[Result]) -> list[str]:
    """Each export's node count and session load time, without -> with opbridge, where both exported; the cases
    whose graph grew by more than GROWTH nodes are named above the table."""
    by_key = {(r.model, r.exporter, r.opset, r.opbridge): r for r in results if r.nodes is not None}
    rows, grown = [], []
    for (model, exporter, opset, with_opbridge), after in by_key.items():
        before = by_key.get((model, exporter, opset, False))
        if not with_opbridge or before is None:
            continue
        load = (
            f"{before.load_ms:.0f} → {after.load_ms:.0f} ms"
            if before.load_ms is not None and after.load_ms is not None
            else "-"
        )
        # Like for like only: a graph that follows the sizes computes what a fixed-size one holds as constants.
        alike = before.outcome == after.outcome
        outcomes = "" if alike else f" ({before.outcome} → {after.outcome})"
        rows.append(f"| `{model}` | {exporter} {opset} | {before.nodes} → {after.nodes}{outcomes} | {load} |")
        if alike and after.nodes > before.nodes + GROWTH:
            grown.append(f"`{after.id}` ({before.nodes} → {after.nodes})")
    if not rows:
        return []
    return [
        "",
        "## Graph size and session load, without → with opbridge",
        "",
        "Nodes of each exported graph (functions and subgraphs included) and ONNX Runtime's session creation",
        "(1 thread, one measurement, a shared machine). With opbridge a model's deformable attention is one node",
        "per layer; elsewhere opbridge's rules should cost at most a few nodes per rewritten op. Where the outcome",
        "differs (fixed size without, ok with) the graph computes from the sizes what the other holds as constants:",
        "those rows name both outcomes and are not counted. "
        + (
            f"Grown by more than {GROWTH} nodes: {', '.join(grown)}."
            if grown
            else f"No graph grew by more than {GROWTH} nodes."
        ),
        "",
        "| model | export | nodes | session load |",
        "|---|---|---|---|",
        *rows,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from .._cli import models_parser

    args = models_parser().parse_args(argv)
    if args.speed:
        print(speed_markdown(speed(args.image, args.threads), args.image, args.threads))
        return 0
    if args.case:
        result = run_case(*parse_id(args.case), timing=args.timing)
        if args.json_line:
            print(json.dumps(dataclasses.asdict(result)))
        else:
            print(f"{result.outcome}: {result.cause or 'matches eager'} ({result.id})")
        return 0 if result.outcome == "ok" else 1
    cases = select(args.models, args.fast)
    if not cases:
        print(f"models: nothing matches {args.models}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    exports = [e for e in EXPORTS if not args.exporters or e[0] in args.exporters]
    start = time.perf_counter()
    results = sweep(cases, exports, args.timeout, dtype=args.dtype)
    seconds = time.perf_counter() - start
    from .parity import environment

    env = {k: v for k, v in environment().items() if k in ("torch", "torchvision", "onnxruntime", "python")}
    try:
        from importlib.metadata import version

        env["transformers"] = version("transformers")
    except Exception:
        env["transformers"] = "-"
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(results, env, seconds))
    problems = regressions(results)
    for problem in problems:
        print(f"REGRESSION {problem}", file=sys.stderr)
    counts = {o: sum(r.outcome == o for r in results) for o in OUTCOMES}
    print(f"models: {len(results)} cases in {seconds:.0f} s: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
