"""Detectors: defenses that read what their party receives and raise an alarm (or stop the run) when it
is not what an honest peer could send."""
