"""Core data types: tensor metadata, the checkpoint contract and the report.

The leaf of the package: it imports nothing else from mtpcheck and only the standard
library, so every other layer can depend on it. Import the types from here; the modules
group them by job (tensor metadata, the checkpoint contract, check results and the report,
acceptance figures).
"""

from mtpcheck.model.acceptance import (
    AcceptanceDelta,
    AcceptanceResult,
    ChainAcceptance,
    DepthAcceptance,
    EngineAcceptance,
    EngineDelta,
    Estimate,
    OnlineAcceptance,
    ServerAcceptance,
    Share,
)
from mtpcheck.model.check_names import CHECKS, CheckInfo, CheckName
from mtpcheck.model.checkpoint import (
    Checkpoint,
    DeclaresQuantization,
    HasByteSpans,
    HasSpanReader,
    HeadersOnly,
    IntegrityIssue,
    MainModelElsewhere,
    Naming,
    Prefetches,
    ReadsSlices,
    RecordsWriter,
    read_whole,
)
from mtpcheck.model.checkpoint_data import CheckpointData, ViewData
from mtpcheck.model.results import (
    CheckpointSummary,
    CheckResult,
    FailingFinding,
    Finding,
    MtpLayerReport,
    Report,
    Status,
    TensorComparison,
    TensorStatus,
)
from mtpcheck.model.tensors import (
    ByteSpan,
    TensorColumns,
    TensorMeta,
    TensorTable,
    files_of,
    total_nbytes,
)

__all__ = [
    "CHECKS",
    "AcceptanceDelta",
    "AcceptanceResult",
    "ByteSpan",
    "ChainAcceptance",
    "CheckInfo",
    "CheckName",
    "CheckResult",
    "Checkpoint",
    "CheckpointData",
    "CheckpointSummary",
    "DeclaresQuantization",
    "RecordsWriter",
    "DepthAcceptance",
    "EngineAcceptance",
    "EngineDelta",
    "Estimate",
    "FailingFinding",
    "Finding",
    "HasByteSpans",
    "HasSpanReader",
    "HeadersOnly",
    "MainModelElsewhere",
    "IntegrityIssue",
    "MtpLayerReport",
    "Naming",
    "OnlineAcceptance",
    "Prefetches",
    "ReadsSlices",
    "Report",
    "ServerAcceptance",
    "Share",
    "Status",
    "TensorColumns",
    "TensorComparison",
    "TensorMeta",
    "TensorStatus",
    "TensorTable",
    "ViewData",
    "files_of",
    "read_whole",
    "total_nbytes",
]
