# zsock_bench stream: the layout of the AZ-SDP paper's fig. 6b. Redraw with: gnuplot stream.gp
set terminal pngcairo size 560,440 enhanced font ",10"
set output "stream.png"
set grid
set key top left
set logscale x 2
set xlabel "message size (bytes)"
set xtics ("64K" 65536, "1M" 1.04858e+06)
set xrange [46811.42857:1468006.4]
set yrange [0:*]
set ylabel "throughput (10^9 bytes/s)"
set title "Uni-directional throughput (the AZ-SDP paper's fig. 6b)" noenhanced
plot "stream.dat" index 0 using 1:2 with linespoints lw 2 title "unet bcopy" noenhanced, \
     "stream.dat" index 1 using 1:2 with linespoints lw 2 title "unet zcopy" noenhanced, \
     "stream.dat" index 2 using 1:2 with linespoints lw 2 title "unet azcopy" noenhanced, \
     "stream.dat" index 3 using 1:2 with linespoints lw 2 title "kernel TCP" noenhanced
