import pytest
import torch

from gpubench.measure.flops import (
    FlopCount,
    count_flops,
    count_flops_detailed,
    is_heavy_op,
    matmul_peak_flops,
)

BATCH, HIDDEN, LAYERS, HEADS, VOCAB, CLASSES = 2, 64, 2, 4, 512, 3


def test_count_flops_of_linear_forward_and_backward():
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64, requires_grad=True)

    def step():
        layer(x).sum().backward()

    # forward 2*16*64*32; backward: grad wrt input and wrt weight, each as large.
    assert count_flops(step) == 3 * 2 * 16 * 64 * 32


def _transformer_step_flops(seq: int, *, inner: int, head_tokens: int, head_out: int,
                            pooler: bool, model: bool = False) -> int:
    """Analytic FLOPs (2 per multiply-add) of one forward and backward of a transformer
    encoder/decoder stack plus its output head, every parameter trained.

    Per layer and token, forward: QKV projections 3 * 2*H*H, output projection 2*H*H, MLP
    2 * 2*H*inner; attention: scores Q K^T 2*seq*H and the weighted sum of V 2*seq*H (the
    full seq x seq matrix, causal or not, as torch counts attention). Backward: twice the
    forward of every matmul (gradient of the input and of the weight; the embeddings feed the
    first layer and train, so every input gradient is needed), and for attention four products
    (grad of V, of the probabilities, of Q, of K) plus the recompute of the scores that the
    flash kernels do instead of saving them: 5/2 of the attention forward. ``model``: model
    FLOPs, the published convention (no recomputation): the attention backward is twice its
    forward, as for every other matmul.
    """
    tokens = BATCH * seq
    dense = tokens * (3 * 2 * HIDDEN * HIDDEN + 2 * HIDDEN * HIDDEN + 2 * 2 * HIDDEN * inner)
    attention = 2 * (2 * BATCH * seq * seq * HIDDEN)
    head = 2 * head_tokens * HIDDEN * head_out + (2 * BATCH * HIDDEN * HIDDEN if pooler else 0)
    backward = 2 * attention if model else attention * 5 // 2
    return LAYERS * (3 * dense + attention + backward) + 3 * head


def _bert(seq: int, model: bool = False):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, intermediate_size=4 * HIDDEN,
                     max_position_embeddings=seq, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=CLASSES)
    model_flops, net = model, BertForSequenceClassification(cfg)
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    labels = torch.randint(0, CLASSES, (BATCH,))
    expected = _transformer_step_flops(seq, inner=4 * HIDDEN, head_tokens=BATCH,
                                       head_out=CLASSES, pooler=True, model=model_flops)
    return (lambda: net(input_ids=ids, labels=labels).loss.backward()), expected


def _gpt2(seq: int, model: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model_flops, net = model, GPT2LMHeadModel(cfg)
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    # The LM head (tied to the token embedding) produces logits at every position.
    expected = _transformer_step_flops(seq, inner=4 * HIDDEN, head_tokens=BATCH * seq,
                                       head_out=VOCAB, pooler=False, model=model_flops)
    return (lambda: net(input_ids=ids, labels=ids).loss.backward()), expected


@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
@pytest.mark.parametrize("seq", [16, 256])
def test_transformer_step_flops_match_analytic_count(build, seq):
    step, expected = build(seq)
    counted = count_flops_detailed(step)
    assert isinstance(counted, FlopCount)
    assert counted.uncounted_ops == []
    assert abs(counted.total / expected - 1) < 0.02, (counted.total, expected, counted.by_op)


@pytest.mark.parametrize("build", [_bert, _gpt2], ids=["bert", "gpt2"])
@pytest.mark.parametrize("seq", [64, 512])
def test_model_flops_follow_the_published_convention(build, seq):
    """Model FLOPs leave out the fused attention backward's recompute of the scores (it
    counted 5 matmuls where the model needs 4: x1.067 at sequence 512): within 2% of the
    analytic count, attention in full."""
    step, expected = build(seq, model=True)
    counted = count_flops_detailed(step)
    assert abs(counted.model_total / expected - 1) < 0.02, (counted.model_total, expected)
    assert counted.total > counted.model_total or not any(
        "attention" in op for op in counted.by_op)  # the math path has no recompute


def _conv_net_model_flops(model, x) -> int:
    """Analytic model FLOPs of a step of a conv net from its layers' shapes (forward hooks):
    2 per multiply-add of every Conv2d and Linear forward, backward twice that except the
    first layer's input gradient (the images need none)."""
    macs = []

    def hook(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1]
            macs.append(output.numel() * module.in_channels // module.groups * k)
        else:
            macs.append(inputs[0].numel() // module.in_features * module.in_features
                        * module.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return 2 * (3 * sum(macs) - macs[0])


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_model_flops_match_the_analytic_count(name):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    expected = _conv_net_model_flops(model, x)
    counted = count_flops_detailed(
        lambda: torch.nn.functional.cross_entropy(model(x), y).backward())
    assert abs(counted.model_total / expected - 1) < 0.02, (counted.model_total, expected)
    assert counted.model_total == counted.total  # nothing recomputed


@pytest.mark.parametrize("model", ["bert", "resnet18", "gpt2"])
def test_a_checkpointed_case_has_its_base_cases_model_flops(model):
    """Checkpointing re-runs each block's forward in backward: hardware FLOPs grow by about a
    third, model FLOPs stay the plain case's."""
    import itertools

    from gpubench.measure.flops import counting_flops
    from gpubench.train.build import build as build_case
    from gpubench.train.config import RunConfig

    counts = []
    for checkpointing in (False, True):
        case = build_case(RunConfig(model=model, profile="smoke", checkpointing=checkpointing))
        with counting_flops() as counted:
            case.step(itertools.cycle(case.fixed_batches()))
        case.close()
        counts.append(counted.result)
    plain, ckpt = counts
    assert ckpt.total > 1.1 * plain.total
    assert ckpt.model_total == plain.model_total


def test_cpu_attention_is_counted():
    step, _ = _gpt2(64)
    default = count_flops_detailed(step, custom_mapping={})  # torch's registry alone
    ours = count_flops_detailed(step)
    cpu_ops = {"aten._scaled_dot_product_flash_attention_for_cpu",
               "aten._scaled_dot_product_flash_attention_for_cpu_backward"}
    if not cpu_ops & set(ours.by_op) and not cpu_ops & set(default.no_formula_ops):
        pytest.skip("this torch does not run the CPU flash attention kernel here")
    assert cpu_ops <= set(default.uncounted_ops)  # torch alone counts it as zero and says so
    assert ours.total > default.total
    # forward: 2 products of 2*B*S*S*H; backward: 5 of them.
    attention = LAYERS * 7 * 2 * BATCH * 64 * 64 * HIDDEN
    assert ours.total - default.total == attention
    assert cpu_ops <= set(ours.by_op)
    assert count_flops(step) == ours.total


def _resnet18_analytic(batch: int, classes: int) -> int:
    """ResNet-18 on 32 px images: conv1 7x7/2 -> 16x16, max-pool -> 8x8, then four stages of
    two basic blocks (64@8x8, 128@4x4, 256@2x2, 512@1x1), the first block of stages 2-4 with
    a stride-2 3x3 conv and a 1x1 stride-2 projection; then the 512 -> classes linear layer."""
    def conv(cin, cout, k, side):  # multiply-adds per image
        return cout * side * side * cin * k * k

    stem = conv(3, 64, 7, 16)
    macs = stem + 4 * conv(64, 64, 3, 8)
    for cin, cout, side in ((64, 128, 4), (128, 256, 2), (256, 512, 1)):
        macs += conv(cin, cout, 3, side) + conv(cout, cout, 3, side) + conv(cin, cout, 1, side)
        macs += 2 * conv(cout, cout, 3, side)
    macs += 512 * classes
    # Backward: gradient of the input and of the weight, except the stem's input (the images).
    return batch * 2 * (3 * macs - stem)


def test_resnet18_step_flops_match_conv_and_linear_count():
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    counted = count_flops_detailed(
        lambda: torch.nn.functional.cross_entropy(model(x), y).backward())
    assert counted.uncounted_ops == []
    assert counted.total == _resnet18_analytic(4, 10)


def test_heavy_op_names():
    for name in ("aten.mm", "aten._scaled_dot_product_flash_attention_for_cpu_backward",
                 "aten.convolution_backward", "aten.conv2d", "aten.einsum", "aten._int_mm",
                 "mkldnn._convolution_pointwise", "aten.mkldnn_rnn_layer", "aten._fft_r2c",
                 "aten.addmv", "aten.linear"):
        assert is_heavy_op(name), name
    for name in ("aten.add", "aten.upsample_bilinear2d", "aten.gelu", "aten.native_layer_norm",
                 "aten._log_softmax", "aten.embedding_dense_backward", "aten.t",
                 "aten._convert_indices_from_coo_to_csr", "aten.sum", "aten.mul"):
        assert not is_heavy_op(name), name


def test_a_matmul_slower_than_a_loop_is_timed_once_per_loop():
    """The peak's loops are about 0.1 s: a 0.15 s matmul runs once per loop (warm-up, the
    size probe, then the best of three), not three times per loop."""
    import time

    from gpubench.measure.flops import _best_flops

    calls = []

    def matmul(n):
        def run():
            calls.append(n)
            time.sleep(0.15)
        return run

    flops = _best_flops(matmul, torch.device("cpu"), cap=256)
    assert calls == [256] * 5
    assert 0 < flops <= 2 * 256**3 / 0.15


def test_measured_matmul_peak_is_positive_and_cached():
    first = matmul_peak_flops("cpu", "fp32")
    assert first > 1e8
    assert matmul_peak_flops("cpu", "fp32") == first


@pytest.mark.parametrize("changes", [
    {"optimizer": "adamw", "optimizer_impl": "foreach"}, {"zero_grad_set_to_none": False},
    {"empty_cache": True}, {"precision": "tf32"},
])
def test_a_count_reused_between_cases_equals_counting_again(changes):
    """``count_key`` leaves out only what changes neither the ops nor the saved tensors: the
    reused figures must equal a fresh count of the case."""
    from gpubench.measure import protocol as measure
    from gpubench.measure.protocol import InProcess
    from gpubench.train.config import RunConfig

    base = RunConfig(model="resnet18", profile="smoke")
    measure._LAST_COUNT.clear()
    fresh = {}
    for cfg in (base, base.with_(**changes)):
        measure._LAST_COUNT.clear()
        with InProcess(cfg) as case:
            fresh[cfg] = case.call("count")[0]
    measure._LAST_COUNT.clear()
    with InProcess(base) as case:
        case.call("count")
    with InProcess(base.with_(**changes)) as case:
        reused = case.call("count")[0]
    assert reused.pop("count_reused") is True
    assert reused == fresh[base.with_(**changes)]


def test_a_count_is_not_reused_where_the_step_differs():
    from gpubench.measure import protocol as measure
    from gpubench.measure.protocol import InProcess
    from gpubench.train.config import RunConfig

    base = RunConfig(model="resnet18", profile="smoke")
    measure._LAST_COUNT.clear()
    with InProcess(base) as case:
        first = case.call("count")[0]
    for changes in ({"checkpointing": True}, {"accum_steps": 2}, {"precision": "bf16"}):
        with InProcess(base.with_(**changes)) as case:
            other = case.call("count")[0]
        assert "count_reused" not in other, changes
    assert first["flops"] > 0


@pytest.mark.parametrize("changes", [{}, {"accum_steps": 2}, {"checkpointing": True}])
def test_the_checks_first_step_counts_what_a_separate_count_step_counts(changes):
    """``CaseProgram.check`` counts FLOPs and saved activations around its first training
    step; they must equal a count over a step of their own."""
    from gpubench.measure import protocol as measure
    from gpubench.measure.protocol import InProcess
    from gpubench.train.config import RunConfig

    cfg = RunConfig(model="bert", profile="smoke", **changes)
    measure._LAST_COUNT.clear()
    with InProcess(cfg) as case:
        alone = case.call("count")[0]
    measure._LAST_COUNT.clear()
    with InProcess(cfg) as case:
        case.call("check")
        assert case.program._counted is not None
        during_check = case.call("count")[0]
    assert during_check == alone and alone["flops"] > 0 and alone["activation_bytes"] > 0


def test_the_machines_peaks_on_a_cpu_import_neither_torchao_nor_the_model_libraries():
    """FP8 has no peak of its own without FP8 units, and the library versions come from the
    installed metadata: the run's machine facts cost no import of seconds."""
    import subprocess
    import sys

    code = ("import sys; from gpubench.measure.machine import machine_info; "
            "info = machine_info('cpu'); "
            "print(sorted(m for m in ('torchao', 'transformers', 'torchvision') "
            "if m in sys.modules), info['matmul_peak_tflops']['fp8'], info['transformers'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ["[]", "None"], out
    assert out[2] != "None"
