# zsock_bench pagefault: the layout of the AZ-SDP paper's fig. 8. Redraw with: gnuplot pagefault.gp
set terminal pngcairo size 1120,440 enhanced font ",10"
set output "pagefault.png"
set grid
set key top left
set multiplot layout 1,2 title "Impact of page faults (the AZ-SDP paper's fig. 8)"
set logscale x 2
set xlabel "window size W (transfers between buffer touches)"
set xrange [0.7142857143:89.6]
set yrange [0:*]
set ylabel "throughput (10^9 bytes/s)"
set title "(a) 64Kbyte messages" noenhanced
plot "pagefault.dat" index 0 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "pagefault.dat" index 1 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "pagefault.dat" index 2 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "pagefault.dat" index 3 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced
set title "(b) 1Mbyte messages" noenhanced
plot "pagefault.dat" index 4 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "pagefault.dat" index 5 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "pagefault.dat" index 6 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "pagefault.dat" index 7 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced
unset multiplot
