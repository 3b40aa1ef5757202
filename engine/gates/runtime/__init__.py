"""Gate 2 — runtime: llama.cpp against transformers on the same token ids (tokenizer, embeddings, relevance
scores, logits), and what the file costs against its source. `gate.py` is its entry point and registration."""
