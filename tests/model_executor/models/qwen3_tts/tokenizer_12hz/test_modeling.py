import pytest
import torch

from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz import (
    InvalidCodesError,
    Qwen3TTSTokenizerV2Decoder,
    Qwen3TTSTokenizerV2DecoderConfig,
)
from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
    SnakeBeta,
    sliding_window_mask,
)
from vllm_omni.testing.codes import random_codes
from vllm_omni.testing.random_weights import random_decoder_state


def random_decoder(config: Qwen3TTSTokenizerV2DecoderConfig, seed: int = 0) -> Qwen3TTSTokenizerV2Decoder:
    decoder = Qwen3TTSTokenizerV2Decoder(config).eval()
    shapes = {name: t.shape for name, t in decoder.state_dict().items()}
    decoder.load_state_dict(random_decoder_state(shapes, seed=seed, num_quantizers=config.num_quantizers))
    decoder.precompute_snake_caches()
    return decoder


def test_output_is_one_channel_of_total_upsample_samples_per_frame(small_decoder):
    audio = small_decoder(random_codes(11))
    assert small_decoder.total_upsample == 48
    assert audio.shape == (1, 1, 11 * 48) and audio.dtype == torch.float32
    assert audio.abs().max() <= 1.0


def test_any_geometry_decodes_including_one_without_convnext_upsampling(odd_geometry):
    decoder = random_decoder(odd_geometry)
    codes = random_codes(9, num_quantizers=4, codebook_size=512)
    with torch.no_grad():
        audio = decoder(torch.cat([codes, codes.flip(-1)]))
    assert decoder.total_upsample == 10
    assert audio.shape == (2, 1, 90)
    assert not torch.allclose(audio[0], audio[1])


def test_decoder_is_causal_a_prefix_decodes_to_the_prefix_of_the_audio(small_decoder):
    codes = random_codes(40)
    with torch.no_grad():
        full = small_decoder(codes)
        prefix = small_decoder(codes[..., :17])
    assert (full[..., : 17 * 48] - prefix).abs().max() < 1e-6


def test_sliding_window_lets_a_frame_see_itself_and_window_minus_one_back():
    mask = sliding_window_mask(5, 2, torch.device("cpu"))
    allowed = (mask == 0).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]


def test_transformer_receptive_field_is_layers_times_window_minus_one(small_decoder):
    transformer = small_decoder.pre_transformer  # 2 layers, window 8: frame t sees t-14 .. t
    hidden = torch.randn(1, 30, 96, generator=torch.Generator().manual_seed(1))
    changed = hidden.clone()
    changed[:, 0] += 1.0
    with torch.no_grad():
        delta = (transformer(hidden) - transformer(changed)).abs().amax(dim=-1)[0]
    assert delta[14] > 1e-4
    assert delta[15:].max() == 0


def test_precomputed_snake_constants_give_identical_audio_and_reset_on_load(small_checkpoint):
    from vllm_omni.edge.checkpoint import load_code2wav_decoder

    decoder = load_code2wav_decoder(small_checkpoint)
    codes = random_codes(6)
    with torch.no_grad():
        cached = decoder(codes)
        snakes = [m for m in decoder.modules() if isinstance(m, SnakeBeta)]
        assert all(m.alpha_exp is not None for m in snakes)
        state = decoder.state_dict()
        decoder.load_state_dict(state)
        assert all(m.alpha_exp is None for m in snakes)
        assert torch.equal(decoder(codes), cached)


def test_chunked_decode_reproduces_the_reference_chunking(small_decoder):
    codes = random_codes(23)
    with torch.no_grad():
        chunked = small_decoder.chunked_decode(codes, chunk_size=10, left_context_size=4)
        # chunk 0: frames 0..9 alone; chunk 1: frames 6..19 keeping 10..19; chunk 2: 16..22 keeping 20..22.
        expected = torch.cat(
            [
                small_decoder(codes[..., 0:10]),
                small_decoder(codes[..., 6:20])[..., 4 * 48 :],
                small_decoder(codes[..., 16:23])[..., 4 * 48 :],
            ],
            dim=-1,
        )
        full = small_decoder(codes)
    assert torch.equal(chunked, expected)
    assert chunked.shape == full.shape
    assert torch.equal(small_decoder.chunked_decode(codes, chunk_size=300), small_decoder(codes))


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (torch.zeros(16, 5, dtype=torch.long), "rank 3"),
        (torch.zeros(1, 15, 5, dtype=torch.long), "must have 16 codebooks on dim 1.*found 15"),
        (torch.zeros(1, 5, 16, dtype=torch.long), "found 5"),
        (torch.zeros(1, 16, 5), "integer tensor.*found torch.float32"),
        (torch.zeros(1, 16, 0, dtype=torch.long), "at least one frame"),
        (torch.full((1, 16, 5), 2048), "0..2047, found values in 2048..2048"),
        (
            torch.tensor([[[0, -1]] * 16]),
            r"found values in -1..0 \(first bad at \[batch, codebook, frame\] = \[0, 0, 1\]",
        ),
        ([[0] * 16], "must be a torch.Tensor"),
    ],
)
def test_bad_codes_raise_a_typed_error_saying_expected_and_found(small_decoder, codes, message):
    with pytest.raises(InvalidCodesError, match=message):
        small_decoder(codes)


def test_chunked_decode_checks_codes_too(small_decoder):
    with pytest.raises(InvalidCodesError, match="0..2047"):
        small_decoder.chunked_decode(torch.full((1, 16, 5), 4096))


def test_torch_export_takes_the_decoder_and_matches_eager(small_decoder):
    codes = random_codes(12)
    program = torch.export.export(small_decoder, (codes,), strict=False)
    with torch.no_grad():
        assert (program.module()(codes) - small_decoder(codes)).abs().max() < 1e-6


def test_legacy_onnx_exporter_takes_the_decoder_and_onnxruntime_matches_eager(small_decoder, tmp_path):
    import onnxruntime

    codes = random_codes(12)
    path = tmp_path / "decoder.onnx"
    torch.onnx.export(
        small_decoder,
        (codes,),
        str(path),
        input_names=["audio_codes"],
        output_names=["audio"],
        opset_version=17,
        dynamo=False,
    )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (audio,) = session.run(None, {"audio_codes": codes.numpy()})
    with torch.no_grad():
        assert abs(audio - small_decoder(codes).numpy()).max() < 1e-5
