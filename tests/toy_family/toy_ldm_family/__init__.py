"""A toy model family for sd-launcher, from outside its checkout: `family` (the Family), `stage` (its data
step, toy_marks), `marks` (that step's job program), `conf/` (its training preset, training=toy/tiny_256)."""
