"""FID and CLIP score on COCO-2014 val: the evaluation stage's job programs and what they share."""
