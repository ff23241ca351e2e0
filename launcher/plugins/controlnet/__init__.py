"""ControlNet on SD 1.5 (NeMo's ControlLDM, controlnet_train.py), an in-tree plugin: `family` (the Family),
`stage` (its data step, controlnet_hints), `hints` (that step's job program), `conf/` (its training preset,
training=controlnet/sd15_512). docs/controlnet.md."""
