"""The protocol's generated message types and service base, in one place.

They come from the `rocketmq-python-client` package (apache/rocketmq-clients), which ships the
code protoc generated from apache/rocketmq-apis v2 as `rocketmq.grpc_protocol`; nothing here is
written by hand. Every other module of `broker.grpc` imports them from here.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as spb_grpc

Code = pb.Code
Status = pb.Status

__all__ = ["Code", "Status", "pb", "spb", "spb_grpc"]
