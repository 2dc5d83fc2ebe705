"""Collect: the I/O shell that reads the machine while a program runs.

collector.py reads every sensor once per tick with the machine's and the program's CPU
clocks (probes.py); sensors/ holds one small backend per kind of power reading;
checkpoint.py and memory.py keep a long run and its exact peaks. Nothing here imports
analysis or render: what is collected is folded by core/ into a Profile of facts.
"""
