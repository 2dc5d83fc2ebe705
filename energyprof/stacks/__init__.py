"""Stack samplers: each turns 'what is running now' into samples on the shared clock.

`threads` (default, `sampler.Sampler`): one hidden thread reading sys._current_frames();
every Python thread, no per-call cost, the same code in every process of a job.
`pyinstrument`: pyinstrument's C profile hook on the main thread; precise and async-aware,
but it runs on every call.
"""
