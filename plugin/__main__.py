from plugin.entry import main

main()
