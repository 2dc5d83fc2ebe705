"""Where carbon intensity and CPU TDP figures come from: codecarbon's data or the shipped snapshot."""
