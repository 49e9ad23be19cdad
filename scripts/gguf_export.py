"""The bundled GGUF's weights in another llama.cpp type, offline: what `python -m engine.bench peer --peer-ggufs`
runs beside the bundled Q4_1, so llama.cpp's own F32 and BF16 decode can be set beside ours (fp32, bf16wo).

Runs in the llama-cpp-python venv (never a dependency of the project): `pip install gguf` there, then
    /tmp/llama-venv/bin/python scripts/gguf_export.py SRC.gguf DST-BF16.gguf BF16
SRC is the bundled file (`python -c "from engine.model.loader import bundled_gguf_path; print(bundled_gguf_path())"`
in this project's venv). Every 2-D tensor is dequantized to fp32 (the values our loader reads) and stored as TYPE
(F32, F16 or BF16); 1-D ones (norms) stay F32; the metadata (tokenizer, chat template, sizes) is copied as is.
Why our own few lines: llama.cpp's converter reads a transformers folder and ships in its source tree, not
in the wheel; gguf's reader, dequantizer and writer are all this needs.
"""

import argparse

import gguf
import numpy as np


def export(src: str, dst: str, kind: str) -> None:
    target = getattr(gguf.GGMLQuantizationType, kind)
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue  # the writer writes the header and the architecture itself; the file type is no longer Q4_1
        kind_of = field.types[0]
        if kind_of == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind_of, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind_of)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        values = values.reshape(tuple(int(n) for n in reversed(t.shape)))  # ggml lists the innermost size first
        if values.ndim == 2 and target != gguf.GGMLQuantizationType.F32:
            packed = gguf.quants.quantize(values, target)
            writer.add_tensor(t.name, packed, raw_shape=packed.shape, raw_dtype=target)
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("type", choices=["F32", "F16", "BF16"])
    a = p.parse_args()
    export(a.src, a.dst, a.type)
    print(f"wrote {a.dst} ({a.type})")
