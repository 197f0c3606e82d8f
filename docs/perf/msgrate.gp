# zsock_bench msgrate: the layout of the AZ-SDP paper's . Redraw with: gnuplot msgrate.gp
set terminal pngcairo size 560,440 enhanced font ",10"
set output "msgrate.png"
set grid
set key top left
set logscale x 2
set xlabel "message size (bytes)"
set xtics ("8" 8, "64" 64)
set xrange [5.714285714:89.6]
set yrange [0:*]
set ylabel "message rate (10^6 messages/s)"
set title "Message rate" noenhanced
plot "msgrate.dat" index 0 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "msgrate.dat" index 1 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced, \
     "msgrate.dat" index 2 using 1:2 with linespoints lw 2 title "kernel TCP busy-polled" noenhanced
