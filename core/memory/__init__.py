"""Per-user memory: core memory blocks in the prompt, archival memory and conversation search, with tools."""

from core.memory.blocks import BLOCKS_JSON_SQL, Block, load_blocks, normalise_name, render_prompt_section
from core.memory.embeddings import Embedder, openai_embedder, prepare_embeddings
from core.memory.manage import Overview, Wiped, delete_memory_line, memory_overview, wipe_memory
from core.memory.search import insert_archival, search_archival, search_conversation
from core.memory.tools import memory_tools

__all__ = [
    "BLOCKS_JSON_SQL",
    "Block",
    "Embedder",
    "Overview",
    "Wiped",
    "delete_memory_line",
    "insert_archival",
    "load_blocks",
    "memory_overview",
    "memory_tools",
    "normalise_name",
    "openai_embedder",
    "prepare_embeddings",
    "render_prompt_section",
    "search_archival",
    "search_conversation",
    "wipe_memory",
]
