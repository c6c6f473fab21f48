"""A mixer with a deliberate bug (it raises in its forward), so the runner's internal-error path can be run for
real: ``model.encoder.mixer._target_=tests.faults.crashing_mixer.CrashingMixer``."""

from __future__ import annotations

from seqmix.mixers import SelfAttention

MESSAGE = "deliberate bug in a test mixer"


class CrashingMixer(SelfAttention):
    def forward(self, x, key_padding_mask=None, state=None):
        raise RuntimeError(MESSAGE)
