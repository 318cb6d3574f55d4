"""Delay and timer messages: RocketMQ 4 delay levels and RocketMQ 5 arbitrary delivery times, over one
replicated mechanism (see `service.py` and `index.py`)."""
