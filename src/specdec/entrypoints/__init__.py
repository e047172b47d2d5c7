"""How users reach the engine: the Python decoder (`decoder.SpecDecoder`), the asyncio engine
and token streams (`async_engine`, `streaming`), chat templates (`chat`), the OpenAI-compatible
server (`server`) and the command line (`cli`, `cli_flags`). Nothing here is imported by the
engine or the plugins; this package's own import loads nothing (`specdec --help` stays light).
"""
