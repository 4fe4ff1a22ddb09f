from uberprof.cli import main

main()
