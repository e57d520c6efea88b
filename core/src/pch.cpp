// Translation unit that builds the precompiled header shared by LibTorch targets.
