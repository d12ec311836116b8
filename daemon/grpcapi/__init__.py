"""The gRPC API: the servicers of InferenceService, ControlService, RetrievalService and
AnswerService, grpc.health.v1, and the per-call plumbing (authentication, error mapping,
decoding, connection limits, the listener).
"""
