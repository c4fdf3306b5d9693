#!/usr/bin/env python
import os, sys; os.execv(sys.executable, [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"), "cpu_lora_ops", *sys.argv[1:]])  # alias of scripts/bench cpu_lora_ops
