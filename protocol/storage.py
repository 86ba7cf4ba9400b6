"""Messages of the storage service (workspaces, usage and restoration, datasets): no I/O.

A workspace travels as a :class:`Manifest` (every file with its chunks' content hashes) and the
chunks the cluster lacks (:class:`ChunkData`, packed into requests of bounded size). Importing this
module registers the messages with the codec.
"""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar

from hfai.protocol.types import message
from hfai.protocol.verbs import Verb

# Verbs on hfai.storage.<user>.<verb> (operators: hfai.storage.<user>.op.<verb>).
VERB_WS_MISSING = "ws_missing"
VERB_WS_PUT = "ws_put"
VERB_WS_COMMIT = "ws_commit"
# Is the service still committing this workspace? A pushing client asks every second while it
# waits for its commit, so a service that died mid-commit is noticed in seconds.
VERB_WS_COMMIT_STATUS = "ws_commit_status"
# Is the workspace already exactly the manifest of this digest? A push that changed nothing
# ends with this one question, without sending the manifest or committing it.
VERB_WS_CURRENT = "ws_current"
# A manifest too large for one message travels in pieces (ManifestPart up, ManifestSlice down).
VERB_WS_MANIFEST_PART = "ws_manifest_part"
VERB_WS_MANIFEST_SLICE = "ws_manifest_slice"
#: The largest encoded manifest (some ten million files): it travels in pieces, and is decoded
#: with this bound where one message's would refuse it.
MAX_MANIFEST_BYTES = 1024**3
VERB_WS_FETCH = "ws_fetch"
VERB_WS_LIST = "ws_list"
VERB_WS_REMOVE = "ws_remove"
VERB_USAGE = "usage"
VERB_RESTORE = "restore"
VERB_DATASET_LIST = "dataset_list"
VERB_DATASET_ADD = "dataset_add"


@message("ws_file")
class FileEntry:
    """One regular file of a workspace: its path relative to the workspace root (``/``-separated),
    size, permission bits and the content hashes of its fixed-size chunks, in order."""

    KIND: ClassVar[str]
    path: str
    size: int
    mode: int = 0o644
    chunks: tuple[str, ...] = ()


@message("ws_manifest")
class Manifest:
    KIND: ClassVar[str]
    files: tuple[FileEntry, ...] = ()
    chunk_bytes: int = 0


@message("ws_chunk")
class ChunkData:
    KIND: ClassVar[str]
    hash: str
    data: bytes


@message("ws_missing_request")
class MissingRequest:
    """Which of these chunks does the cluster lack for this workspace?"""

    KIND: ClassVar[str]
    workspace: str
    hashes: tuple[str, ...]


@message("ws_missing_reply")
class MissingReply:
    KIND: ClassVar[str]
    hashes: tuple[str, ...]


@message("ws_put_request")
class PutRequest:
    """Chunks to stage for a push (kept until a commit has written them, so a push resumes).
    ``whole``: those of them that are, each alone, a file's whole content; ``file``: if set, all
    of them are chunks ``first``, ``first + 1``, … of one file, ``file`` being the SHA-256 (hex)
    of that file's chunk names joined by newlines. Both are hints: the service keeps such chunks
    in a file of their own, at their places, which the commit links into the workspace when it
    holds exactly a file's chunks, instead of copying them (it checks that, not the hint). A
    chunk whose ``hash`` is empty is of a file the client did not hash, its whole content or,
    with ``file`` (then a key of the client's choosing), its chunk at its place: the service
    names it (its SHA-256, as it checks a named one) and the reply lists the names."""

    KIND: ClassVar[str]
    workspace: str
    chunks: tuple[ChunkData, ...]
    whole: tuple[str, ...] = ()
    file: str = ""
    first: int = 0


@message("ws_put_reply")
class PutReply:
    KIND: ClassVar[str]
    stored: int
    hashes: tuple[str, ...] = ()  # for a put with unnamed chunks: every chunk's name, in order


@message("ws_commit_request")
class CommitRequest:
    """Make the cluster's copy of the workspace exactly this manifest. ``upload``: if set, the
    manifest is not in this request (``manifest`` is empty) but was sent before it in
    :class:`ManifestPart` pieces of that upload; ``digest`` is then the SHA-256 (hex) of the
    whole encoded manifest, which the service checks before it decodes it."""

    KIND: ClassVar[str]
    workspace: str
    manifest: Manifest
    upload: str = ""
    digest: str = ""


@message("ws_manifest_part")
class ManifestPart:
    """``data`` is the bytes at ``offset`` of an encoded manifest of ``total`` bytes, uploaded
    as ``upload`` (32 hex digits of the client's choosing) for the commit that names it."""

    KIND: ClassVar[str]
    workspace: str
    upload: str
    offset: int
    total: int
    data: bytes


@message("ws_manifest_part_reply")
class ManifestPartReply:
    KIND: ClassVar[str]
    stored: int = 0


@message("ws_manifest_slice_request")
class ManifestSliceRequest:
    """At most ``limit`` bytes, from ``offset``, of the workspace's last committed manifest, encoded."""

    KIND: ClassVar[str]
    workspace: str
    offset: int = 0
    limit: int = 0


@message("ws_manifest_slice")
class ManifestSlice:
    """A piece of the encoded manifest: ``total`` bytes in all, ``digest`` their SHA-256 (hex), so
    a client that read pieces of two manifests (a commit between its requests) can tell."""

    KIND: ClassVar[str]
    data: bytes = b""
    total: int = 0
    digest: str = ""


@message("ws_commit_status")
class CommitStatus:
    """Whether the service is committing (or about to commit) ``workspace`` for the caller now."""

    KIND: ClassVar[str]
    workspace: str
    committing: bool = False


@message("ws_commit_journal")
class CommitJournal:
    """The service's own record of a commit in progress, kept in its state directory (never on the
    wire) so a service killed midway finishes or undoes the commit when it starts again
    (:mod:`hfai.storage.commit`). ``old_ino``/``new_ino``: inode numbers of the workspace's
    directory before the commit (0: there was none) and of the tree assembled for it; which of
    them is at the workspace's path says how far the commit got. ``phase``: a
    :class:`hfai.storage.commit.Phase` value."""

    KIND: ClassVar[str]
    workspace: str
    manifest: Manifest
    delete: tuple[str, ...] = ()
    old_ino: int = 0
    new_ino: int = 0
    phase: str = "built"


@message("ws_current_request")
class CurrentRequest:
    """``digest``: the SHA-256 (hex) of the manifest's encoding (hfai.storage.rules.manifest_digest)."""

    KIND: ClassVar[str]
    workspace: str
    digest: str


@message("ws_current_reply")
class CurrentReply:
    """``current``: the workspace on the cluster is that manifest, files on disk (``info`` then set)."""

    KIND: ClassVar[str]
    current: bool = False
    info: WorkspaceInfo | None = None


@message("ws_request")
class WorkspaceRequest:
    """Names one workspace (manifest, remove)."""

    KIND: ClassVar[str]
    workspace: str


@message("ws_fetch_request")
class FetchRequest:
    KIND: ClassVar[str]
    workspace: str
    hashes: tuple[str, ...]


@message("ws_chunks")
class Chunks:
    KIND: ClassVar[str]
    chunks: tuple[ChunkData, ...] = ()


@message("ws_info")
class WorkspaceInfo:
    """A workspace on the cluster: ``path`` is where jobs find it on the shared filesystem."""

    KIND: ClassVar[str]
    name: str
    path: str
    files: int = 0
    bytes: int = 0
    pushed_ts: float = 0.0


@message("ws_list_request")
class ListWorkspaces:
    KIND: ClassVar[str]


@message("ws_list")
class WorkspaceList:
    KIND: ClassVar[str]
    workspaces: tuple[WorkspaceInfo, ...] = ()


@message("storage_usage_request")
class UsageRequest:
    KIND: ClassVar[str]


@message("storage_usage_reply")
class UsageReply:
    """A user's storage: bytes used in their workspaces, the limit, and why they are restricted
    (empty: not restricted)."""

    KIND: ClassVar[str]
    user: str
    used: int
    limit: int
    restricted: str = ""
    workspaces: tuple[WorkspaceInfo, ...] = ()


@message("dataset_info")
class DatasetInfo:
    """A dataset at ``path`` (under the datasets root jobs see): public, or readable by ``group`` only."""

    KIND: ClassVar[str]
    name: str
    path: str
    group: str = ""
    public: bool = True


@message("dataset_list_request")
class DatasetListRequest:
    KIND: ClassVar[str]


@message("dataset_list")
class DatasetList:
    KIND: ClassVar[str]
    datasets: tuple[DatasetInfo, ...] = field(default_factory=tuple)


@message("dataset_add_request")
class DatasetAddRequest:
    """Operators: publish the directory ``path`` (on the shared filesystem) as dataset ``name``;
    with ``group``, private to that Unix group."""

    KIND: ClassVar[str]
    name: str
    path: str
    group: str = ""


# ---------------------------------------------------------------------------------- verbs
# The storage service's verbs, each stated once as hfai.protocol.verbs states the controller's:
# the service decodes a request as its verb's ``request`` (hfai.storage.service) and the client
# calls by them (``StorageClient.scall(WS_LIST, ListWorkspaces())`` is typed ``WorkspaceList``).
# ``repeatable``: a second copy changes nothing and costs little, so the client sends copies to
# the service's queue group when one does not answer (hfai.api.client.try_plan). Not a request
# or reply that carries chunks, hashes by the thousand or a manifest's piece (a copy would move
# its megabytes again: a push or pull that times out is run again whole), nor what changes state
# (commit, remove, restore, dataset_add).

WS_MISSING = Verb(VERB_WS_MISSING, MissingRequest, MissingReply)
WS_PUT = Verb(VERB_WS_PUT, PutRequest, PutReply)
WS_COMMIT = Verb(VERB_WS_COMMIT, CommitRequest, WorkspaceInfo)
WS_COMMIT_STATUS = Verb(VERB_WS_COMMIT_STATUS, WorkspaceRequest, CommitStatus, repeatable=True)
WS_CURRENT = Verb(VERB_WS_CURRENT, CurrentRequest, CurrentReply, repeatable=True)
WS_MANIFEST_PART = Verb(VERB_WS_MANIFEST_PART, ManifestPart, ManifestPartReply)
WS_MANIFEST_SLICE = Verb(VERB_WS_MANIFEST_SLICE, ManifestSliceRequest, ManifestSlice)
WS_FETCH = Verb(VERB_WS_FETCH, FetchRequest, Chunks)
WS_LIST = Verb(VERB_WS_LIST, ListWorkspaces, WorkspaceList, repeatable=True)
WS_REMOVE = Verb(VERB_WS_REMOVE, WorkspaceRequest, WorkspaceInfo)
USAGE = Verb(VERB_USAGE, UsageRequest, UsageReply, repeatable=True)
RESTORE = Verb(VERB_RESTORE, UsageRequest, UsageReply)
DATASET_LIST = Verb(VERB_DATASET_LIST, DatasetListRequest, DatasetList, repeatable=True)
DATASET_ADD = Verb(VERB_DATASET_ADD, DatasetAddRequest, DatasetInfo)

#: Every storage verb by name: what the storage service serves, and all it serves.
STORAGE_VERBS: dict[str, Verb] = {v.name: v for v in (
    WS_MISSING, WS_PUT, WS_COMMIT, WS_COMMIT_STATUS, WS_CURRENT, WS_MANIFEST_PART, WS_MANIFEST_SLICE, WS_FETCH,
    WS_LIST, WS_REMOVE, USAGE, RESTORE, DATASET_LIST, DATASET_ADD)}
