from runstream.engine.cli import main

main()
