"""The decoder's checkpoint formats: Hugging Face directories (`hf_config.py`: config.json <->
ModelConfig; `hf_io.py`: safetensors in and out), GGUF files (`gguf_reader.py`, `gguf_quants.py`,
`gguf_arch.py`, `gguf_tokenizer.py`; `gguf_io.py`: a .gguf -> a Hugging Face directory; `gguf_export.py`:
a run's params -> a .gguf), and the pretrained models fetched from the package index (`pretrained.py`).
The decoder itself (model/transformer.py and its neighbours) reads none of them."""
