"""Knobs: settings of the machine that change its power (read, range, set, restore).

One module per kind; each knob stands on `base.Knob`. Both the in-process users (the sweep, the
online optimizer) and the privileged reader (`energyprof sensors serve`, for users without root)
drive knobs through that one interface.
"""
