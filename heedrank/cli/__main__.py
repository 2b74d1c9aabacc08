from heedrank.cli import main

main()
