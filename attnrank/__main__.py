from attnrank.cli import main

if __name__ == "__main__":
    main()
