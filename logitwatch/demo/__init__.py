"""Demo training job for logitwatch: a tiny byte-level GPT with two settings.

``logitwatch.demo.train.SETTINGS["unstable"]`` (no QK-norm, float16 attention scores,
very high learning rate) diverges after a few hundred steps of attention-logit growth;
``SETTINGS["healthy"]`` is the same run with QK-norm and does not. See ``train.py``.
"""
