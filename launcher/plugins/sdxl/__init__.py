"""SDXL (NeMo's MegatronDiffusionEngine, sd_xl_train.py), an in-tree plugin: `family` (the Family), `checks`
(what its training config is refused for), and the job-side parts only SDXL uses: `infer` (sd_xl_infer.py's
configs), `rehearsal` (the rehearsal's one image), `text_cache` (the cached text embeddings the encode step
writes), `text_encoders` (the staged encoders put back) and `generate` (the evaluation's images). Its presets
stay in conf/training/sdxl/. docs/sdxl.md."""
