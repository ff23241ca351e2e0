"""FID and CLIP score on COCO-2014 val: what the evaluation's jobs (launcher.jobs.captions, generate, score,
evaluation_plot) and the evaluation stage share."""
