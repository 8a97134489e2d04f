"""Run the official qwen-tts talker (text -> codec frames, reference audio -> speaker embedding): the
numerical oracle for our vLLM talker and our speaker encoder.

Needs the oracle venv (``make setup-oracle`` -> ``.venv-oracle``: qwen-tts 0.1.1 with its pinned
transformers 4.57.3, which the main venv cannot import):

    .venv-oracle/bin/python tools/oracle/qwen_tts_talker_oracle.py [generate] --checkpoint DIR \
        --requests REQ.json --out OUT.json [--threads 1]
    .venv-oracle/bin/python tools/oracle/qwen_tts_talker_oracle.py speaker-embedding --checkpoint DIR \
        --audio AUDIO [AUDIO ...] --out OUT.npz [--threads 1]

(``generate`` may be left out: the form callers used before ``speaker-embedding`` existed.)

``DIR`` is a checkpoint in the released layout (``config.json``, ``generation_config.json``,
``model.safetensors`` with ``talker.*`` tensors, the text tokenizer files), e.g. one written by
``python -m vllm_omni.testing.make_checkpoint --out DIR --talker tiny``. Its
``speech_tokenizer/`` is never touched: the codes are not decoded to audio here.

1. ``Qwen3TTSForConditionalGeneration`` is built from ``DIR/config.json`` (eager attention,
   float32, eval) and ``DIR/model.safetensors`` is loaded with ``load_state_dict(strict=True)``, so
   the checkpoint's tensor names and shapes are validated against the official module.
   (``Qwen3TTSForConditionalGeneration.from_pretrained`` is not used: it also loads the official
   speech tokenizer, which our ``speech_tokenizer/`` - decoder only - cannot satisfy.)
2. The text processor is loaded as ``Qwen3TTSModel.from_pretrained`` does (registered
   ``Qwen3TTSProcessor``, ``fix_mistral_regex=True``), the generate defaults from
   ``DIR/generation_config.json``, and a real ``Qwen3TTSModel`` wrapper is built around them, so
   prompts are tokenized and generate kwargs merged by the official helper methods.
3. Each request runs alone (batch 1, no padding) through the body of
   ``Qwen3TTSModel.generate_custom_voice`` (``generate_voice_design`` for a voice_design
   checkpoint) up to and including ``self.model.generate(...)``; ``torch.manual_seed(0)`` first.

REQ.json is a list of objects: ``text``, ``speaker`` (or null), ``language`` (null -> "Auto"),
``instruct`` (or null), ``non_streaming_mode`` (bool), ``max_new_tokens`` (int), ``greedy`` (bool,
default true: ``do_sample=False`` and ``subtalker_dosample=False``, overriding the checkpoint's
generation_config, which samples), optionally ``repetition_penalty`` and any other
``_merge_generate_kwargs`` argument (``top_k``, ``temperature``, ``subtalker_top_p``, ...).

OUT.json: ``{"requests": [{"codes": [[16 ints] per frame], "input_ids": [...], "instruct_ids":
[...] or null, "seconds": float, "generate_kwargs": {...}}], "transformers": ..., "qwen_tts": ...,
"torch": ..., "threads": n}``. ``input_ids``/``instruct_ids`` are the (flattened) token ids the
official wrapper produced, so tokenization can be checked separately from generation;
``seconds`` is the wall time of the ``model.generate`` call.

``speaker-embedding`` (a Base checkpoint: ``speaker_encoder.*`` is loaded strictly with the rest) runs
``Qwen3TTSModel.create_voice_clone_prompt(ref_audio=[...], x_vector_only_mode=True)`` itself, so the
official code loads each AUDIO (a file path: ``librosa.load(sr=None, mono=True)``; an ``.npz`` with
``samples`` and ``sample_rate``: the ``(np.ndarray, sr)`` input), resamples it to 24 kHz
(``librosa.resample``, soxr HQ) and calls ``extract_speaker_embedding``. The speech tokenizer it also
calls for the reference codes is a stand-in returning no codes: x-vector mode drops them, and the
codes are the speech tokenizer encoder's oracle's business. OUT.npz: ``embedding_{i}`` ``[enc_dim]``
(from the prompt item), ``samples_24k_{i}`` (what ``extract_speaker_embedding`` received),
``mel_{i}`` ``[frames, 128]`` (the official ``mel_spectrogram`` of those samples, as that method
calls it), ``mel_basis`` (``librosa.filters.mel`` as ``mel_spectrogram`` calls it) and ``versions``
(JSON).

Behaviour of the official code worth knowing when comparing (qwen-tts 0.1.1):
  * ``generate`` forces ``min_new_tokens=2``, ``eos_token_id=codec_eos_token_id`` and suppresses
    ``[vocab_size - 1024, vocab_size)`` except EOS, so codebook 0 stays below ``vocab_size - 1024``.
  * A frame's codebooks 1..15 are predicted when its codebook-0 token is fed back, so the last
    sampled token (EOS, or the ``max_new_tokens``-th token) never becomes a frame: a run that hits
    the limit yields ``max_new_tokens - 1`` frames.
  * ``repetition_penalty`` (HF logits processor) acts on the talker's codebook-0 history only,
    also in greedy mode; the code predictor gets no penalty.
  * ``generate_custom_voice`` drops ``instruct`` when ``tts_model_size in "0b6"`` (a substring
    test, so it also fires for "", "0b", "b6", ...).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

# Arguments of Qwen3TTSModel._merge_generate_kwargs a request may set directly.
MERGE_KEYS = (
    "do_sample",
    "top_k",
    "top_p",
    "temperature",
    "repetition_penalty",
    "subtalker_dosample",
    "subtalker_top_k",
    "subtalker_top_p",
    "subtalker_temperature",
)

# Modules that `import qwen_tts` imports but that neither the talker path nor the speaker-embedding path
# calls: the 25 Hz speech tokenizer's (sox, onnxruntime, torchaudio.compliance.kaldi). They are not installed
# in the oracle venv. (librosa and soundfile are: the Base model's reference-audio path needs them.)
STUB_MODULES = (
    "sox",
    "onnxruntime",
    "torchaudio",
    "torchaudio.compliance",
    "torchaudio.compliance.kaldi",
)


class _StubModule(types.ModuleType):
    """A placeholder module: any public attribute is a callable that raises when called."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        qualified = f"{self.__name__}.{attr}"

        def never_called(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"{qualified} is a stub (tools/oracle/qwen_tts_talker_oracle.py); never called on this path"
            )

        never_called.__qualname__ = qualified
        return never_called


def install_stubs() -> list[str]:
    """Put stub modules into ``sys.modules`` for each of STUB_MODULES that is not installed."""
    installed = []
    for name in STUB_MODULES:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        if not parent and importlib.util.find_spec(name) is not None:
            continue  # the real package is installed: use it
        if parent and not isinstance(sys.modules.get(parent), _StubModule):
            continue
        module = _StubModule(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        module.__path__ = []
        sys.modules[name] = module
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], module)
        installed.append(name)
    return installed


def import_official() -> types.SimpleNamespace:
    """The official classes, after installing the stubs the import chain needs."""
    if importlib.util.find_spec("qwen_tts") is None:
        raise SystemExit("qwen_tts is not importable here; run this with .venv-oracle/bin/python (make setup-oracle)")
    import torch  # noqa: F401  (before the stubs, so torch/transformers see no fake packages)
    import transformers

    stubs = install_stubs()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel

    return types.SimpleNamespace(
        transformers=transformers,
        stubs=stubs,
        Qwen3TTSConfig=Qwen3TTSConfig,
        Qwen3TTSForConditionalGeneration=Qwen3TTSForConditionalGeneration,
        Qwen3TTSProcessor=Qwen3TTSProcessor,
        Qwen3TTSModel=Qwen3TTSModel,
    )


def load_model(official: types.SimpleNamespace, checkpoint: Path):
    """``Qwen3TTSForConditionalGeneration`` from config.json, weights loaded strictly."""
    import torch
    from safetensors.torch import load_file

    config = official.Qwen3TTSConfig(**json.loads((checkpoint / "config.json").read_text()))
    config._attn_implementation = "eager"  # the setter propagates to talker/code predictor configs
    model = official.Qwen3TTSForConditionalGeneration(config).to(torch.float32).eval()

    state = load_file(str(checkpoint / "model.safetensors"))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{name}: checkpoint {tuple(state[name].shape)} vs official {tuple(expected[name].shape)}"
        for name in sorted(set(state) & set(expected))
        if state[name].shape != expected[name].shape
    ]
    if missing or unexpected or mismatched:
        lines = [f"{checkpoint / 'model.safetensors'} does not match the official module:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
            if items:
                lines.append(f"  {title} ({len(items)}):")
                lines.extend(f"    {item}" for item in items)
        raise SystemExit("\n".join(lines))
    model.load_state_dict({name: t.to(torch.float32) for name, t in state.items()}, strict=True)

    attn = {type(m).__name__: m.config._attn_implementation for m in model.modules() if hasattr(m, "attention_dropout")}
    if set(attn.values()) != {"eager"}:
        raise SystemExit(f"attention implementation is not eager everywhere: {attn}")
    return model


def load_wrapper(official: types.SimpleNamespace, checkpoint: Path, model):
    """A ``Qwen3TTSModel`` around ``model``, with processor and defaults as its from_pretrained loads them."""
    from transformers import AutoConfig, AutoModel, AutoProcessor

    AutoConfig.register("qwen3_tts", official.Qwen3TTSConfig)
    AutoModel.register(official.Qwen3TTSConfig, official.Qwen3TTSForConditionalGeneration)
    AutoProcessor.register(official.Qwen3TTSConfig, official.Qwen3TTSProcessor)
    processor = AutoProcessor.from_pretrained(str(checkpoint), fix_mistral_regex=True)
    if not isinstance(processor, official.Qwen3TTSProcessor):
        raise SystemExit(f"AutoProcessor returned {type(processor)}, expected Qwen3TTSProcessor")

    # Qwen3TTSForConditionalGeneration.from_pretrained: json.load(generation_config.json) -> model.generate_config
    generate_config = json.loads((checkpoint / "generation_config.json").read_text(encoding="utf-8"))
    model.load_generate_config(generate_config)
    return official.Qwen3TTSModel(model=model, processor=processor, generate_defaults=model.generate_config)


def run_request(wrapper, request: dict[str, Any]) -> dict[str, Any]:
    """One request through the official wrapper, up to ``model.generate`` (no speech-tokenizer decode).

    Mirrors the bodies of ``generate_custom_voice`` / ``generate_voice_design`` (qwen-tts 0.1.1)
    for a single text; keep it line for line in step with them.
    """
    import torch

    text = request["text"]
    language = request.get("language")
    speaker = request.get("speaker")
    instruct = request.get("instruct")
    non_streaming_mode = bool(request["non_streaming_mode"])

    kwargs: dict[str, Any] = {key: request[key] for key in MERGE_KEYS if request.get(key) is not None}
    kwargs["max_new_tokens"] = int(request["max_new_tokens"])
    if request.get("greedy", True):
        kwargs["do_sample"] = False
        kwargs["subtalker_dosample"] = False

    self = wrapper
    model_type = self.model.tts_model_type
    if model_type == "base":
        return run_voice_clone(wrapper, request, kwargs)
    if model_type not in ("custom_voice", "voice_design"):
        raise SystemExit(f"tts_model_type {model_type!r}: only custom_voice, voice_design and base are supported")

    texts = self._ensure_list(text)
    languages = (
        self._ensure_list(language)
        if isinstance(language, list)
        else ([language] * len(texts) if language is not None else ["Auto"] * len(texts))
    )
    if model_type == "custom_voice":
        speakers = self._ensure_list(speaker)
        if self.model.tts_model_size in "0b6":  # official: "for 0b6 model, instruct is not supported"
            instruct = None
        instructs = (
            self._ensure_list(instruct)
            if isinstance(instruct, list)
            else ([instruct] * len(texts) if instruct is not None else [""] * len(texts))
        )
    else:
        speakers = None
        instructs = self._ensure_list(instruct)
    if not (len(texts) == len(languages) == len(instructs) == 1 and (speakers is None or len(speakers) == 1)):
        raise SystemExit(f"one text, language, speaker and instruct per request: {request}")

    self._validate_languages(languages)
    if speakers is not None:
        self._validate_speakers(speakers)

    input_ids = self._tokenize_texts([self._build_assistant_text(t) for t in texts])

    instruct_ids: list[torch.Tensor | None] = []
    for ins in instructs:
        if ins is None or ins == "":
            instruct_ids.append(None)
        else:
            instruct_ids.append(self._tokenize_texts([self._build_instruct_text(ins)])[0])

    gen_kwargs = self._merge_generate_kwargs(**kwargs)
    extra = {"speakers": speakers} if speakers is not None else {}

    torch.manual_seed(0)
    start = time.perf_counter()
    talker_codes_list, _ = self.model.generate(
        input_ids=input_ids,
        instruct_ids=instruct_ids,
        languages=languages,
        non_streaming_mode=non_streaming_mode,
        **extra,
        **gen_kwargs,
    )
    seconds = time.perf_counter() - start

    return {
        "codes": talker_codes_list[0].tolist(),
        "input_ids": input_ids[0].flatten().tolist(),
        "instruct_ids": None if instruct_ids[0] is None else instruct_ids[0].flatten().tolist(),
        "seconds": seconds,
        "generate_kwargs": gen_kwargs,
    }


def run_voice_clone(wrapper, request: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One Base request: ``create_voice_clone_prompt`` (the official audio loading, speaker encoder and speech
    tokenizer encoder), then the body of ``generate_voice_clone`` (qwen-tts 0.1.1) for a single text, up to
    and including ``self.model.generate(...)``; keep it line for line in step with them.

    Request fields beyond ``generate``'s: ``ref_audio`` (a path, or an ``.npz`` of ``samples`` and
    ``sample_rate``), ``ref_text`` (or null), ``x_vector_only_mode`` (bool).
    """
    import torch

    self = wrapper
    if self.model.speech_tokenizer is None:
        raise SystemExit("a Base request needs the speech tokenizer: run with a checkpoint that has speech_tokenizer/")
    items = self.create_voice_clone_prompt(
        ref_audio=official_audio_input(Path(request["ref_audio"])),
        ref_text=request.get("ref_text"),
        x_vector_only_mode=bool(request.get("x_vector_only_mode", False)),
    )
    language = request.get("language")
    texts = self._ensure_list(request["text"])
    languages = [language] * len(texts) if language is not None else ["Auto"] * len(texts)
    self._validate_languages(languages)
    voice_clone_prompt_dict = self._prompt_items_to_voice_clone_prompt(items)
    ref_texts_for_ids = [it.ref_text for it in items]
    input_ids = self._tokenize_texts([self._build_assistant_text(t) for t in texts])
    ref_ids = []
    for rt in ref_texts_for_ids:
        ref_ids.append(None if rt is None or rt == "" else self._tokenize_texts([self._build_ref_text(rt)])[0])
    gen_kwargs = self._merge_generate_kwargs(**kwargs)

    torch.manual_seed(0)
    start = time.perf_counter()
    talker_codes_list, _ = self.model.generate(
        input_ids=input_ids,
        ref_ids=ref_ids,
        voice_clone_prompt=voice_clone_prompt_dict,
        languages=languages,
        non_streaming_mode=bool(request["non_streaming_mode"]),
        **gen_kwargs,
    )
    seconds = time.perf_counter() - start
    item = items[0]
    return {
        "codes": talker_codes_list[0].tolist(),
        "input_ids": input_ids[0].flatten().tolist(),
        "instruct_ids": None,
        "speaker_embedding": item.ref_spk_embedding.float().flatten().tolist(),
        "reference_codes": None if item.ref_code is None else item.ref_code.tolist(),
        "seconds": seconds,
        "generate_kwargs": gen_kwargs,
    }


def attach_speech_tokenizer(model, checkpoint: Path) -> None:
    """The official speech tokenizer of ``checkpoint/speech_tokenizer``, as ``from_pretrained`` attaches it."""
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    model.load_speech_tokenizer(Qwen3TTSTokenizer.from_pretrained(str(checkpoint / "speech_tokenizer")))


def run_generate(args: argparse.Namespace) -> int:
    official = import_official()
    import torch

    torch.set_num_threads(args.threads)
    requests = json.loads(args.requests.read_text(encoding="utf-8"))
    if not isinstance(requests, list):
        raise SystemExit(f"{args.requests}: expected a JSON list of requests")

    model = load_model(official, args.checkpoint)
    if model.tts_model_type == "base":
        attach_speech_tokenizer(model, args.checkpoint)
    wrapper = load_wrapper(official, args.checkpoint, model)

    results = []
    for index, request in enumerate(requests):
        result = run_request(wrapper, request)
        results.append(result)
        print(
            f"[talker-oracle] request {index}: {len(result['input_ids'])} text ids, "
            f"{len(result['codes'])} frames, {result['seconds']:.2f} s",
            flush=True,
        )

    out = {
        "requests": results,
        "transformers": official.transformers.__version__,
        "qwen_tts": importlib.metadata.version("qwen-tts"),
        "torch": torch.__version__,
        "threads": args.threads,
        "stubbed_modules": official.stubs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


class CodesNotComputed:
    """The speech tokenizer as ``create_voice_clone_prompt`` sees it, minus the codes: x-vector mode drops
    them (``ref_code=None``), so ``encode`` only records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def encode(self, audios: Any, sr: int) -> types.SimpleNamespace:
        count = len(audios) if isinstance(audios, list) else 1
        self.calls.append((count, int(sr)))
        return types.SimpleNamespace(audio_codes=[None] * count)


def official_audio_input(path: Path) -> Any:
    """A ``create_voice_clone_prompt`` input: a file path (str) or, for ``.npz``, ``(samples, sample_rate)``."""
    import numpy as np

    if path.suffix != ".npz":
        return str(path)
    with np.load(path) as arrays:
        return arrays["samples"], int(arrays["sample_rate"])


def speaker_embeddings(model, wrapper, audio: list[Path]) -> dict[str, Any]:
    """The official embeddings of ``audio``, through ``create_voice_clone_prompt`` (see the module docstring)."""
    import librosa
    import numpy as np
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    received: list[np.ndarray] = []
    extract = model.extract_speaker_embedding

    def recording_extract(audio, sr):  # the official method, its input kept
        received.append(np.array(audio, dtype=np.float32, copy=True))
        return extract(audio=audio, sr=sr)

    model.extract_speaker_embedding = recording_extract
    model.load_speech_tokenizer(CodesNotComputed())
    items = wrapper.create_voice_clone_prompt(
        ref_audio=[official_audio_input(path) for path in audio], x_vector_only_mode=True
    )
    if len(received) != len(audio) or len(items) != len(audio):
        raise SystemExit(f"expected {len(audio)} embeddings, got {len(items)} items and {len(received)} extractions")

    import torch

    out: dict[str, Any] = {}
    for index, (item, samples) in enumerate(zip(items, received, strict=True)):
        out[f"embedding_{index}"] = item.ref_spk_embedding.float().cpu().numpy()
        out[f"samples_24k_{index}"] = samples
        # As extract_speaker_embedding calls it (qwen-tts 0.1.1), transposed to [frames, mels].
        mel = mel_spectrogram(
            torch.from_numpy(samples).unsqueeze(0),
            n_fft=1024,
            num_mels=128,
            sampling_rate=24000,
            hop_size=256,
            win_size=1024,
            fmin=0,
            fmax=12000,
        )
        out[f"mel_{index}"] = mel[0].transpose(0, 1).numpy()
        print(
            f"[talker-oracle] {audio[index].name}: {samples.shape[0]} samples at 24 kHz, "
            f"{out[f'mel_{index}'].shape[0]} frames, embedding {tuple(out[f'embedding_{index}'].shape)}",
            flush=True,
        )
    # As mel_spectrogram calls it.
    out["mel_basis"] = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    out["librosa"] = librosa.__version__
    return out


def run_speaker_embedding(args: argparse.Namespace) -> int:
    official = import_official()
    import numpy as np
    import soxr
    import torch

    torch.set_num_threads(args.threads)
    model = load_model(official, args.checkpoint)
    if model.speaker_encoder is None:
        raise SystemExit(
            f"{args.checkpoint}: tts_model_type {model.tts_model_type!r} has no speaker encoder (Base only)"
        )
    wrapper = load_wrapper(official, args.checkpoint, model)
    out = speaker_embeddings(model, wrapper, args.audio)
    versions = {
        "qwen_tts": importlib.metadata.version("qwen-tts"),
        "transformers": official.transformers.__version__,
        "torch": torch.__version__,
        "librosa": out.pop("librosa"),
        "soxr": soxr.__version__,
        "threads": args.threads,
        "stubbed_modules": official.stubs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("wb") as handle:
        np.savez(handle, versions=np.array(json.dumps(versions)), **out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser("generate", help="greedy/sampled codec frames of JSON requests")
    generate.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (released layout)")
    generate.add_argument("--requests", type=Path, required=True, help="JSON list of requests")
    generate.add_argument("--out", type=Path, required=True, help="where to write the results JSON")
    generate.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    generate.set_defaults(run=run_generate)

    speaker = commands.add_parser("speaker-embedding", help="speaker embeddings of reference audio (Base)")
    speaker.add_argument("--checkpoint", type=Path, required=True, help="Base checkpoint directory (released layout)")
    speaker.add_argument(
        "--audio", type=Path, nargs="+", required=True, help="audio files, or .npz with samples and sample_rate"
    )
    speaker.add_argument("--out", type=Path, required=True, help="where to write the results .npz")
    speaker.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    speaker.set_defaults(run=run_speaker_embedding)

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("-"):
        argv = ["generate", *argv]  # the subcommand-less form (see the module docstring)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
