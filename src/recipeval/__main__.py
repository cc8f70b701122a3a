from recipeval.cli import main

main()
